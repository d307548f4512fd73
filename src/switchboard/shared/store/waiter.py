"""Server-side waits for runs, keyed by run id, without blocking anything.

One pub/sub connection per process listens on the run-ended channel and wakes the
matching futures; the run hash is the source of truth (pub/sub is only a wake-up), so a
waiter subscribes first, then reads the state, and a client that reconnects simply waits
again by run id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis as AsyncRedis

from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.runs import RunRecord

log = logging.getLogger("switchboard.wait")

Fetch = Callable[[str], Awaitable[RunRecord | None]]


class RunWaiter:
    """Wakes local waiters when a run ends; one listener task per process."""

    def __init__(self, redis: AsyncRedis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._waiters: dict[str, set[asyncio.Future[None]]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        """Start listening (idempotent)."""
        if self._task is None or self._task.done():
            self._ready.clear()
            self._task = asyncio.create_task(self._listen(), name="run-waiter")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), 5)

    async def stop(self) -> None:
        """Stop listening."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _listen(self) -> None:
        while True:
            try:
                async with self.redis.pubsub(ignore_subscribe_messages=True) as ps:
                    await ps.subscribe(self.ks.run_events)
                    self._ready.set()
                    # Wake everyone after a (re)subscribe: they re-read state.
                    self._wake_all()
                    async for msg in ps.listen():
                        data = msg.get("data")
                        run_id = data.decode() if isinstance(data, bytes) else str(data)
                        self._wake(run_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._ready.clear()
                log.warning("run-event listener lost its connection (%s); retrying", exc)
                await asyncio.sleep(0.5)

    def _wake(self, run_id: str) -> None:
        for fut in self._waiters.pop(run_id, ()):
            if not fut.done():
                fut.set_result(None)

    def _wake_all(self) -> None:
        for run_id in list(self._waiters):
            self._wake(run_id)

    async def wait(self, run_id: str, timeout_s: float, fetch: Fetch) -> RunRecord | None:
        """The run once it ends, or its current state when ``timeout_s`` passes first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        while True:
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters[run_id].add(fut)
            try:
                rec = await fetch(run_id)
                remaining = deadline - loop.time()
                if rec is None or rec.terminal or remaining <= 0:
                    return rec
                # A lost wake-up costs at most one poll interval, never the whole wait.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fut, min(remaining, 5.0))
            finally:
                self._waiters[run_id].discard(fut)
                if not self._waiters[run_id]:
                    self._waiters.pop(run_id, None)
