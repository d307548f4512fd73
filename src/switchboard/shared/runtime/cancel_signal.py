"""Stopping a run that is executing, when `subagents cancel` asks for it.

The request is a stamp in the store (`RunStore.cancel`), so it reaches the worker that
executes the run whatever process or machine that is: each worker process's lease keeper
(`runtime/leases.py`) reads the requests once a second while it holds lanes, and fires the
`CancelSignal` of a run it executes. The signal cancels the run's model call (an asyncio
task) from the keeper's thread; the executor then ends the run as ``cancelled``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# A cancelled run's error.
CANCELLED_TEXT = "run cancelled (subagents cancel)"
# Why a signal fired: a cancel request, or another attempt took the run (the lease keeper
# found its renewal fenced off): that copy of the run stops and writes nothing.
CANCELLED = "cancelled"
SUPERSEDED = "superseded"


class RunCancelled(Exception):
    """The run's work was stopped by a cancel request."""


class RunSuperseded(Exception):
    """Another attempt has the run (this worker was cut off past its lease): its work
    stops before a tool call, and nothing of it is written."""


class CancelSignal:
    """Fired (from any thread) to stop the work `run` is awaiting; `run` then raises
    `RunCancelled`. A signal fired before `run` starts stops the work at once."""

    def __init__(self) -> None:
        self.fired = False
        self.reason = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    def fire(self, reason: str = CANCELLED) -> None:
        """Ask for the work to stop (thread-safe, idempotent: the first reason stays)."""
        if not self.fired:
            self.reason = reason
        self.fired = True
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not task.done():
            loop.call_soon_threadsafe(task.cancel)

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` as a task of its own; `RunCancelled` when the signal stopped it.
        A cancellation of the caller itself (its deadline) passes through as it is."""
        self._loop = asyncio.get_running_loop()
        task: asyncio.Task[T] = asyncio.ensure_future(work)
        self._task = task
        if self.fired:
            task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.fired and task.cancelled() and (current is None or not current.cancelling()):
                raise RunCancelled from None
            raise
