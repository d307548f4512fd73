"""Work that the runs of one event loop ask for at about the same time, done in one call.

A worker's runs end in waves: a fan-out's children wait on their model side by side, and
its answers arrive together, so hundreds of runs reach their end step, then their
follow-up step, within one turn of the loop. Each one handing its step to a store thread
on its own costs a wake-up across threads and the step's round trips to the store, per
run. `Together` gathers what is asked for while the loop goes round once and hands it all
to one store thread in one call, whose work can share its round trips (the worker's
`Waves`: the end steps of a wave in one round trip, `executor.record_results`; their
follow-ups in one call, `steps.run_follow_ups`, where the sub-agent announces of a wave
read in one round trip and write in another).

A request made while an earlier call is still under way starts the next call as soon as
the loop comes round: nothing waits for a batch to fill, so a lone run pays only the
loop's turn.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from switchboard.shared.runtime.off_loop import through_cancel

__all__ = ["Together"]

A = TypeVar("A")
R = TypeVar("R")


class _Gathered(Generic[A, R]):
    def __init__(self) -> None:
        self.items: list[A] = []
        self.answers: list[asyncio.Future[R]] = []


class Together(Generic[A, R]):
    """Requests gathered on the running loop and done by ``do_all`` off the loop, on the
    loop's default executor (a worker's run loop: its store threads). ``do_all`` is
    given the items of one turn in the order asked and answers one result per item; if it
    raises, every one of them gets the error. ``calls`` counts its calls, ``items`` what
    they were given (for measurements)."""

    def __init__(self, do_all: Callable[[list[A]], Sequence[R]]) -> None:
        self._do_all = do_all
        self._open: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Gathered[A, R]] = (
            weakref.WeakKeyDictionary()
        )
        self.calls = 0
        self.items = 0

    async def __call__(self, item: A) -> R:
        """Do ``item`` with the others asked for this turn; its result.

        Cancelled meanwhile, it waits for the call to return before the cancellation goes
        on (as `off_loop` does: the call may hold state the caller touches next)."""
        loop = asyncio.get_running_loop()
        gathered = self._open.get(loop)
        if gathered is None:
            gathered = self._open[loop] = _Gathered()
            loop.call_soon(self._start, loop)
        answer: asyncio.Future[R] = loop.create_future()
        gathered.items.append(item)
        gathered.answers.append(answer)
        return await through_cancel(answer)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        gathered = self._open.pop(loop)
        self.calls += 1
        self.items += len(gathered.items)
        done = loop.run_in_executor(None, self._do_all, gathered.items)
        done.add_done_callback(lambda call: _answer(call, gathered.answers))


def _answer(call: asyncio.Future[Sequence[R]], answers: list[asyncio.Future[R]]) -> None:
    if call.cancelled():  # the loop is closing: its executor went first
        for answer in answers:
            answer.cancel()
        return
    error = call.exception()
    results: Sequence[R] = () if error is not None else call.result()
    if error is None and len(results) != len(answers):
        error = RuntimeError(f"{len(results)} results for {len(answers)} items")
    for i, answer in enumerate(answers):
        if answer.done():
            continue
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(results[i])
