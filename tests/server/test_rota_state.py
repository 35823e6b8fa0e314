"""The Rota adapter's own state: bounded logs and alerts, the spec registry and its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwire.engine import Dispatch, Engine, EngineConfig, JobState, WorkerSession
from jobwire.protocols.rota import SpecRef, checksum
from jobwire.server.rota.connection import extend_leases
from jobwire.server.rota.journal import AlertStore, LogStore
from jobwire.server.rota.registry import SpecRegistry
from tests.engine.fakes import FakeClock, RecordingHandler


def test_log_lines_per_job_are_bounded_and_the_dropped_counted() -> None:
    logs = LogStore(max_jobs=10, max_lines=3, max_line=5)
    logs.append("j", ["a", "b"], worker="w", attempt=1)
    logs.append("j", ["c", "d", "0123456789"], worker="w", attempt=2)
    log = logs.get("j")
    assert log is not None
    assert [entry["line"] for entry in log.lines] == ["c", "d", "01234…"]
    assert [entry["attempt"] for entry in log.lines] == [2, 2, 2]
    assert log.dropped == 2


def test_the_least_recently_logging_jobs_are_forgotten_first() -> None:
    logs = LogStore(max_jobs=2, max_lines=10)
    logs.append("a", ["1"], worker="w", attempt=1)
    logs.append("b", ["1"], worker="w", attempt=1)
    logs.append("a", ["2"], worker="w", attempt=1)  # a is now the most recent
    logs.append("c", ["1"], worker="w", attempt=1)
    assert logs.get("b") is None
    assert logs.get("a") is not None and logs.get("c") is not None


def test_alerts_are_bounded_and_read_after_an_id() -> None:
    alerts = AlertStore(max_alerts=2)
    for n in range(3):
        alerts.add("info", f"m{n}", job=None, worker="w", hostname="h")
    kept = alerts.since()
    assert [a["message"] for a in kept] == ["m1", "m2"]
    assert [a["message"] for a in alerts.since(kept[0]["id"])] == ["m2"]


def test_registry_verdicts() -> None:
    registry = SpecRegistry()
    spec = {"name": "resize", "version": 1}
    entry, previous = registry.register(spec)
    assert (entry.checksum, previous) == (checksum(spec), None)
    assert registry.verdict(SpecRef("resize", checksum(spec))).accepted
    mismatch = registry.verdict(SpecRef("resize", "0" * 64))
    assert (mismatch.accepted, mismatch.reason) == (False, "checksum_mismatch")
    assert registry.verdict(SpecRef("email", "x")).reason == "not_registered"
    same, previous = registry.register(dict(spec))
    assert same is entry and previous is entry


def test_registry_file_survives_and_a_corrupt_one_stops_the_server(tmp_path: Path) -> None:
    path = tmp_path / "rota-specs.json"
    SpecRegistry(path).register({"name": "resize", "version": 2})
    reopened = SpecRegistry(path)
    entry = reopened.get("resize")
    assert entry is not None and entry.spec == {"name": "resize", "version": 2}
    assert not (tmp_path / "rota-specs.json.tmp").exists()
    path.write_text("[{")
    with pytest.raises(SystemExit, match="cannot read the Rota spec file"):
        SpecRegistry(path)


def test_a_spec_that_cannot_be_saved_is_not_registered(tmp_path: Path) -> None:
    registry = SpecRegistry(tmp_path / "missing-dir" / "rota-specs.json")
    with pytest.raises(OSError):
        registry.register({"name": "resize"})
    assert registry.get("resize") is None


def test_heartbeats_renew_a_lease_once_half_of_it_is_gone() -> None:
    clock = FakeClock()
    engine = Engine(EngineConfig(id_prefix="H:t"), clock=clock)
    handler = RecordingHandler()
    worker = WorkerSession("rota:1", handler, protocol="rota", dispatch=Dispatch.PUSH)
    engine.add_worker(worker)
    engine.add_ability(worker, "resize")
    job, _ = engine.submit("resize", b"x", lease_timeout=10)
    engine.request_work(worker, 1)
    assert handler.assigned == [job]
    assert job.lease_deadline == clock.now + 10
    clock.advance(4)
    extend_leases(engine, worker)  # 6 s left: nothing to do
    assert job.lease_deadline == clock.now + 6
    clock.advance(2)
    extend_leases(engine, worker)  # 4 s left: renewed in full
    assert job.lease_deadline == clock.now + 10
    clock.advance(9)
    engine.run_timers()  # the first deadline has passed; the renewed one holds
    assert job.state is JobState.ACTIVE and handler.revoked == []
    clock.advance(1)
    engine.run_timers()
    assert handler.revoked == [(job, "lease expired")]
