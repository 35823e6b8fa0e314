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


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "discard", "get"]),
            st.one_of(st.integers(1, 20), st.sampled_from(["a", "b", "H:01", "c:1"])),
        )
    )
)
def test_behaves_as_a_dict_of_ids(operations: list[tuple[str, int | str]]) -> None:
    index = JobIndex("H:")
    model: dict[str, Job] = {}
    for action, key in operations:
        job = numbered(key) if isinstance(key, int) else named(key)
        if action == "add":
            index.add(job)
            model[job.id] = job
        elif action == "discard":
            current = model.get(job.id)
            if current is not None:
                index.discard(current)
                del model[job.id]
        assert index.get(job.id) is model.get(job.id)
        assert len(index) == len(model)
    assert dict(index.items()) == model


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
