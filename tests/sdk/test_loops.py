"""CallerLoop: the blocking Client's loop, run by the threads that wait on it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from jobwire.sdk.loops import CallerLoop

WAIT = 30.0  # only bounds a hang; nothing here waits for time to pass


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Start `call` in a thread; the list gets its result or exception."""
    outcome: list[object] = []

    def target() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def finish(thread: threading.Thread, outcome: list[object]) -> object:
    thread.join(WAIT)
    assert not thread.is_alive(), "the call never returned"
    return outcome[0]


def test_runs_work_in_the_calling_thread() -> None:
    caller = CallerLoop()

    async def where() -> int:
        await asyncio.sleep(0)
        return threading.get_ident()

    assert caller.run(where()) == threading.get_ident()
    assert caller.run(where()) == threading.get_ident()  # again: the loop is reused
    caller.close()


def test_the_loop_stops_in_the_turn_its_work_ends() -> None:
    """No loop turn after the work: run_until_complete would take one more, to run the
    done callback that stops the loop."""
    caller = CallerLoop()
    turns = 0

    def tick() -> None:  # once a turn
        nonlocal turns
        turns += 1
        caller.loop.call_soon(tick)

    async def done_at_once() -> int:
        return 1

    caller.loop.call_soon(tick)
    assert caller.run(done_at_once()) == 1
    assert turns == 1
    caller.close()


def test_a_follower_runs_in_the_leaders_turn() -> None:
    """While one call runs the loop, another thread's call runs on it and returns first."""
    caller = CallerLoop()
    leading = threading.Event()
    gate: asyncio.Event | None = None

    async def wait_for_gate() -> str:
        nonlocal gate
        gate = asyncio.Event()
        leading.set()
        await gate.wait()
        return "leader done"

    async def open_gate() -> int:
        assert gate is not None
        gate.set()
        return threading.get_ident()

    leader, led = in_thread(lambda: caller.run(wait_for_gate()))
    assert leading.wait(WAIT)
    follower_ran_in = caller.run(open_gate())  # would hang if calls took turns
    assert follower_ran_in == leader.ident
    assert finish(leader, led) == "leader done"
    caller.close()


def test_a_follower_takes_over_when_the_leader_is_done() -> None:
    """Work still pending when the leader returns is run on by its own (waiting) thread."""
    caller = CallerLoop()
    leading = threading.Event()
    queued = threading.Event()
    release = threading.Event()

    async def leader_work() -> str:
        leading.set()
        # Return only once the follower's work is on the loop, not yet done.
        await asyncio.get_running_loop().run_in_executor(None, queued.wait)
        return "leader done"

    async def follower_work() -> int:
        queued.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait)
        return threading.get_ident()

    leader, led = in_thread(lambda: caller.run(leader_work()))
    assert leading.wait(WAIT)
    follower, followed = in_thread(lambda: caller.run(follower_work()))
    assert finish(leader, led) == "leader done"
    release.set()  # no other call runs the loop now: the follower must
    assert finish(follower, followed) == follower.ident
    caller.close()


def test_exceptions_reach_the_caller() -> None:
    caller = CallerLoop()

    async def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        caller.run(boom())
    caller.close()


def test_from_inside_another_running_loop() -> None:
    """A blocking call from a coroutine works (in a helper thread), if unkindly."""
    caller = CallerLoop()

    async def answer() -> int:
        return 42

    async def main() -> int:
        return caller.run(answer())

    assert asyncio.run(main()) == 42
    caller.close()


def test_from_its_own_callbacks_is_refused() -> None:
    caller = CallerLoop()

    async def inner() -> None:
        pass

    async def outer() -> None:
        caller.run(inner())

    with pytest.raises(RuntimeError, match="deadlock"):
        caller.run(outer())
    caller.close()


def test_closed() -> None:
    caller = CallerLoop()
    caller.close()

    async def anything() -> None:
        pass

    with pytest.raises(RuntimeError, match="closed"):
        caller.run(anything())
