"""Long-lived tasks that run a worker's jobs, instead of a Task per job (Python 3.11).

On Python 3.11 an asyncio Task costs more to create and free than a no-op job costs to run
(every Task is added to a Python-level WeakSet, and removed from it when freed), and its first
step waits for the next loop turn. A `SlotPool` keeps one Task per job slot instead, and runs
a job's first step at once, where the read that brought it is handled, as that slot's task
(what Python 3.12's eager tasks do): a job that never waits is done there, its result written
with the read's other output. A job that does wait is carried on by the slot's task.

What a Task per job gave, each job keeps:

- its own copy of the context (`contextvars`), taken when it starts: every step of the job
  runs in it (`InContext`), so a variable a job sets is not seen by the next;
- `asyncio.current_task()` is a task that runs this job alone while it runs, so
  `asyncio.timeout` and cancelling it work as before;
- a job cancelled from inside (its task cancelled, not the worker ending) ends alone: the
  slot takes back its cancellations (`Task.uncancel`) and serves the next job, which starts
  with none pending, as on a new Task.

When the worker ends (`ending()` is true), cancelling a slot ends it, with its job.
"""

from __future__ import annotations

import asyncio
import contextvars
from asyncio.tasks import _enter_task, _leave_task
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Final

#: `Slot.step` of a job whose first step has not run yet.
NOT_STARTED: Final = object()
#: `Slot.step` of a started job whose task was cancelled before the slot carried it on.
CANCELLED: Final = object()


class InContext:
    """Awaits `coro`, running each of its steps in `context` (what a Task does for its own
    coroutine); `first`: what its first step already yielded, if it ran."""

    __slots__ = ("context", "coro", "first")

    def __init__(
        self, coro: Coroutine[Any, Any, None], context: contextvars.Context, first: object
    ) -> None:
        self.coro = coro
        self.context = context
        self.first = first

    def __await__(self) -> Generator[Any, Any, None]:
        coro = self.coro
        run = self.context.run
        value: Any = None
        error: BaseException | None = None
        step = self.first
        self.first = None
        while True:
            if step is NOT_STARTED:
                step = None
            elif step is CANCELLED:  # deliver it where the job waits, as its Task would
                step = None
                error = asyncio.CancelledError()
            else:
                try:
                    value = yield step  # a future for the Task to wait on, or None
                except GeneratorExit:  # the slot's coroutine is being closed
                    coro.close()
                    raise
                except BaseException as exc:  # a cancellation, thrown into the job
                    error = exc
            try:
                step = run(coro.send, value) if error is None else run(coro.throw, error)
            except StopIteration:
                return
            value = error = None


class Slot:
    """One Task and the job handed to it (None while idle)."""

    __slots__ = ("context", "step", "task", "waiter", "work")

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.waiter: asyncio.Future[None] | None = None  # set while idle
        self.work: Coroutine[Any, Any, None] | None = None
        self.context: contextvars.Context | None = None
        self.step: object = NOT_STARTED


class SlotPool:
    """Runs job coroutines on long-lived slot tasks, one job per slot at a time; as many
    slots as jobs ran at once, made when first needed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ending: Callable[[], bool]) -> None:
        self._loop = loop
        self._ending = ending
        self._idle: list[Slot] = []
        self._all: list[Slot] = []

    def take(self) -> Slot:
        """An idle slot for the next job (`start` it); its task is the job's."""
        if self._idle:
            return self._idle.pop()
        slot = Slot()
        slot.task = self._loop.create_task(self._serve(slot))
        self._all.append(slot)
        return slot

    def start(self, slot: Slot, work: Coroutine[Any, Any, None]) -> bool:
        """Run `work` on `slot` (from `take`): its first step now, as the slot's task, when
        that task has started and no other task is running; the rest on the slot's task.
        True if the first step is left for the slot's task to run (in the next loop turn)."""
        task = slot.task
        assert task is not None
        context = contextvars.copy_context()
        if slot.waiter is None or task.cancelling():
            # The slot's task has not run yet (or a job's cancellation has not reached it):
            # it runs the job from its start.
            self._hand_over(slot, work, context, NOT_STARTED)
            return True
        try:
            _enter_task(self._loop, task)
        except RuntimeError:  # called from a running task: that one cannot be swapped out
            self._hand_over(slot, work, context, NOT_STARTED)
            return True
        try:
            step = context.run(work.send, None)
        except BaseException:  # done (StopIteration), or the job's own error or cancellation
            self._idle.append(slot)
            return False
        finally:
            _leave_task(self._loop, task)
        # If the job cancelled its task in that step, the slot's task is woken with the
        # cancellation, and passes it on to the job (`_serve`).
        self._hand_over(slot, work, context, step)
        return False

    def _hand_over(
        self,
        slot: Slot,
        work: Coroutine[Any, Any, None],
        context: contextvars.Context,
        step: object,
    ) -> None:
        slot.work, slot.context, slot.step = work, context, step
        waiter = slot.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def close(self) -> None:
        """Cancel every slot (ending their jobs) and wait for them to end."""
        tasks = [slot.task for slot in self._all if slot.task is not None]
        self._all.clear()
        self._idle.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, slot: Slot) -> None:
        task = slot.task
        assert task is not None
        try:
            while True:
                work = slot.work
                if work is None:
                    slot.waiter = waiter = self._loop.create_future()
                    try:
                        await waiter
                    except asyncio.CancelledError:
                        if self._ending():
                            raise
                        if slot.work is not None and slot.step is not NOT_STARTED:
                            # The job handed over after its first step cancelled its task
                            # (itself, or its timeout, before the slot went on with it).
                            _cancel_where_it_waits(slot)
                        else:  # a job's cancellation that landed after it ended
                            _take_back_cancellations(task)
                    continue
                context, step = slot.context, slot.step
                assert context is not None
                slot.work = slot.context = None
                slot.step = NOT_STARTED
                try:
                    await InContext(work, context, step)
                except asyncio.CancelledError:
                    if self._ending():
                        raise
                if self._ending():  # a job that outlived the grace period took its slot along
                    return
                if task.cancelling():  # the next job starts with none, as on a new Task
                    _take_back_cancellations(task)
                self._idle.append(slot)
        finally:
            slot.waiter = None
            work = slot.work
            if work is not None:  # handed over, but the slot ended before it went on
                slot.work = None
                _abandon(work, slot.context, slot.step)


def _cancel_where_it_waits(slot: Slot) -> None:
    """What a Task does for a cancellation while its coroutine waits: cancel what it waits
    on and wake it with CancelledError (`InContext` throws it in)."""
    cancel = getattr(slot.step, "cancel", None)
    if cancel is not None:
        cancel()
    slot.step = CANCELLED


def _take_back_cancellations(task: asyncio.Task[None]) -> None:
    while task.cancelling():
        task.uncancel()


def _abandon(
    work: Coroutine[Any, Any, None], context: contextvars.Context | None, step: object
) -> None:
    """End a job its slot will not carry on: cancelled where it waits, as a Task would be."""
    if step is NOT_STARTED or context is None:
        work.close()  # never ran: nothing to unwind
        return
    try:
        context.run(work.throw, asyncio.CancelledError())
    except BaseException:
        return
    work.close()  # it caught the cancellation and waits again: stop it there
