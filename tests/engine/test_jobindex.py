from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jobwire.engine import Engine
from jobwire.engine.job import Job
from jobwire.engine.jobindex import JobIndex


def numbered(number: int, prefix: str = "H:") -> Job:
    job = Job(f"{prefix}{number}", "f", b"")
    job.number = number
    return job


def named(job_id: str) -> Job:
    return Job(job_id, "f", b"")


def test_engine_ids_are_found_by_their_number() -> None:
    index = JobIndex("H:")
    job = numbered(5)
    index.add(job)
    assert index.get("H:5") is job
    assert index["H:5"] is job
    assert "H:5" in index
    assert index.get("H:6") is None
    assert index.get("H:05") is None  # not an id the engine writes
    assert index.get("X:5") is None
    assert len(index) == 1


def test_client_ids_are_kept_by_string_even_in_the_engine_format() -> None:
    index = JobIndex("H:")
    for job_id in ("0190a7c2-7f1e-7d3a-9a10-0c2f1a2b3c4d", "H:7", "H:007", "H:\u0663", "H:"):
        job = named(job_id)
        index.add(job)
        assert index.get(job_id) is job, job_id
    assert len(index) == 5
    assert 7 not in index  # only strings are ids
    assert index.number("H:\u0663") == 0  # a digit to str.isdigit, not to the engine


def test_discard_drops_only_the_job_it_is_given() -> None:
    index = JobIndex("H:")
    old, fresh = numbered(3), numbered(3)  # a revived job: a new record under the same id
    index.add(old)
    index.add(fresh)
    index.discard(old)
    assert index.get("H:3") is fresh
    index.discard(fresh)
    assert index.get("H:3") is None
    client = named("mine")
    index.add(client)
    index.discard(named("mine"))
    assert index.get("mine") is client


def test_iteration_lists_engine_jobs_in_order_then_client_jobs() -> None:
    index = JobIndex("H:")
    jobs = [numbered(1), named("a"), numbered(2)]
    for job in jobs:
        index.add(job)
    assert list(index) == ["H:1", "H:2", "a"]
    assert [job.id for job in index.values()] == ["H:1", "H:2", "a"]
    assert dict(index.items()) == {job.id: job for job in jobs}
    for job in index.values():  # a snapshot: the loop may change the index
        index.discard(job)
    assert len(index) == 0
    index.add(numbered(9))
    index.clear()
    assert list(index) == []


# Numbers mostly count up with now and then a jump (replayed ids) or an old one again (a
# revived job); slack 2 makes the window drop slots, move stragglers and restart often.
_OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["next", "next", "jump", "again", "named", "discard", "discard", "get"]),
        st.integers(0, 10_000),
    ),
    max_size=300,
)


@given(_OPERATIONS, st.sampled_from([0, 2, 4096]))
def test_behaves_as_a_dict_of_ids(operations: list[tuple[str, int]], slack: int) -> None:
    index = JobIndex("H:", slack=slack)
    model: dict[str, Job] = {}
    last = 0
    for action, value in operations:
        if action in ("next", "jump", "again"):
            if action == "next":
                last += 1
                number = last
            elif action == "jump":
                last += value
                number = last = max(last, 1)
            else:
                number = 1 + value % max(last, 1)
            job = numbered(number)
            index.add(job)
            model[job.id] = job
        elif action == "named":
            job = named(f"client-{value % 7}")
            index.add(job)
            model[job.id] = job
        elif action == "discard" and model:
            ids = sorted(model)
            victim = model.pop(ids[value % len(ids)])
            index.discard(victim)
            index.discard(numbered(victim.number) if victim.number else named(victim.id))
        probe = f"H:{1 + value % max(last, 1)}"
        assert index.get(probe) is model.get(probe)
        assert len(index) == len(model)
    assert dict(index.items()) == model
    assert [job.number for job in index.values() if job.number] == sorted(
        job.number for job in model.values() if job.number
    )


def test_a_job_that_stays_does_not_hold_the_window_open() -> None:
    index = JobIndex("H:", slack=8)
    straggler = numbered(1)
    index.add(straggler)
    for number in range(2, 10_000):
        job = numbered(number)
        index.add(job)
        index.discard(job)
    assert index.get("H:1") is straggler
    assert len(index._window) < 100  # not 10,000 empty slots behind one job
    index.discard(straggler)
    assert len(index) == 0


def test_a_revived_straggler_replaces_the_one_moved_out_of_the_window() -> None:
    index = JobIndex("H:", slack=8)
    index.add(numbered(1))  # stays while most of the jobs after it finish
    for number in range(2, 55):
        job = numbered(number)
        index.add(job)
        if number % 5:
            index.discard(job)
    live = len(index)
    fresh = numbered(1)  # Engine.revive: a new record under the same id
    index.add(fresh)
    assert index.get("H:1") is fresh
    assert len(index) == live


def test_the_engine_numbers_its_jobs_and_keeps_client_ids_by_string() -> None:
    engine = Engine()
    plain, _ = engine.enqueue("f", b"")
    submitted, _ = engine.submit("f", b"")
    chosen, _ = engine.submit("f", b"", job_id="client-id")
    assert (plain.number, submitted.number, chosen.number) == (1, 2, 0)
    assert engine.jobs.get(plain.id) is plain
    assert engine.jobs.get(submitted.id) is submitted
    assert engine.jobs.get("client-id") is chosen


def test_replayed_jobs_get_their_numbers_back_and_new_ids_follow_them() -> None:
    engine = Engine()
    prefix = engine.jobs.prefix
    replayed = [Job(f"{prefix}41", "f", b""), Job("client-id", "f", b"")]
    engine.restore(replayed)
    assert [job.number for job in replayed] == [41, 0]
    assert engine.jobs.get(f"{prefix}41") is replayed[0]
    fresh, _ = engine.enqueue("f", b"")
    assert fresh.id == f"{prefix}42"
