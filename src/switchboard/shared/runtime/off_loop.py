"""Blocking store work of a run, off its event loop (a fast path, ``Settings.fast_paths``).

The store's calls are blocking round trips. A worker keeps thousands of runs as coroutines
on a few event loops, and a store call made on a loop holds up every run of that loop (its
model requests, its claims) for the round trip; on a busy machine, where the store's
process waits its turn for a core, for longer. `off_loop` runs such a call on the loop's
default executor instead: the steps of many runs wait on the store side by side while the
loop goes on. The worker gives each of its run loops a pool of its own for this
(`workers.tasks`); elsewhere it is asyncio's default one.
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
    done = loop.run_in_executor(None, contextvars.copy_context().run, call)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await asyncio.wait([done])
        raise
