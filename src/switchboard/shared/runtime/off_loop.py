"""Blocking work of a run, off its event loop.

The store's calls are blocking round trips, and a tool's handler is blocking code. A worker
keeps thousands of runs as coroutines on an event loop, and blocking work done on the loop
holds up every run of that loop (its model requests, its claims) meanwhile; on a busy
machine, where the store's process waits its turn for a core, for longer. `off_loop` runs
such a call on the loop's default executor instead: the work of many runs waits side by
side while the loop goes on. The worker gives each of its run loops a pool of its own for
this (`workers.tasks`); elsewhere it is asyncio's default one.

A run's tool calls, its end step and its follow-up steps go there (`agent_loop`,
`executor`, `workers.tasks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def off_loop(call: Callable[[], T]) -> T:
    """Run ``call`` on the running loop's default executor, in this coroutine's context.

    Cancelled meanwhile, it waits for ``call`` to return before the cancellation goes on:
    ``call`` may hold state the caller touches next (a run's end, its follow-ups)."""
    loop = asyncio.get_running_loop()
    return await through_cancel(loop.run_in_executor(None, contextvars.copy_context().run, call))


async def through_cancel(done: asyncio.Future[T]) -> T:
    """Await ``done``, work under way off the loop; cancelled meanwhile, wait for it to
    be done before the cancellation goes on."""
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await asyncio.wait([done])
        raise
