"""Server-side waits for runs, keyed by run id, without blocking anything.

One pub/sub connection per process listens on the run-ended channel and wakes the
matching futures; the run hash is the source of truth (pub/sub is only a wake-up), so a
waiter subscribes first, then reads the state, and a client that reconnects simply waits
again by run id. Only the end of a run someone waits for is published: a run started for
a waiting caller is marked so as it starts (`NewRun.watched`), and a waiter's read marks
the run it reads (`WATCH_RUN`), in one step, so an end is either published after the mark
or seen by the read. Fire-and-forget runs cost the api no message at all.

A run-ended message carries the ended run's hash (an outcome never changes once written),
so a woken waiter answers without reading it again; the watched runs that ended in the
last minute are kept, so a waiter for a run it started watched after the listener
subscribed (``since``) needs no first read either: if the run has ended, it is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import NoScriptError

from switchboard.shared.store import codec
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import load as load_lua
from switchboard.shared.store.redis_errors import unavailable
from switchboard.shared.store.runs import RunRecord

log = logging.getLogger("switchboard.wait")

Fetch = Callable[[str], Awaitable[RunRecord | None]]

# Ended runs kept for waiters that arrive after the run-ended message (seconds, count).
RECENT_S = 60.0
RECENT_MAX = 10_000


class RunWaiter:
    """Wakes local waiters when a run ends; one listener task per process."""

    def __init__(self, redis: AsyncRedis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._waiters: dict[str, set[asyncio.Future[RunRecord | None]]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        # Ended runs by id: (loop time received, run hash), oldest first.
        self._recent: OrderedDict[str, tuple[float, dict[str, str]]] = OrderedDict()
        # Loop time since which no run-ended message was missed (None: not subscribed),
        # and the newest receive time of an ended run dropped from `_recent` for room.
        self._complete_since: float | None = None
        self._dropped_at = float("-inf")
        self._watch_run = redis.register_script(load_lua("watch_run").source)

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
        lost = False  # one WARNING line per outage, not one per retry
        while True:
            try:
                async with self.redis.pubsub() as ps:
                    await ps.subscribe(self.ks.run_events)
                    async for msg in ps.listen():
                        if msg.get("type") == "subscribe":
                            # Confirmed: from now on no run end is missed.
                            self._complete_since = asyncio.get_running_loop().time()
                            self._ready.set()
                            if lost:
                                log.info("run-event listener reconnected")
                                lost = False
                            # Wake everyone after a (re)subscribe: they re-read state.
                            self._wake_all()
                        elif msg.get("type") == "message":
                            self._ended(*_parse_ended(msg.get("data")))
            except asyncio.CancelledError:
                self._complete_since = None
                raise
            except Exception as exc:
                self._complete_since = None
                self._ready.clear()
                (log.debug if lost else log.warning)(
                    "run-event listener lost its connection (%s); retrying", exc
                )
                lost = True
                await asyncio.sleep(0.5)

    def _ended(self, run_id: str, fields: dict[str, str] | None) -> None:
        if fields:
            now = asyncio.get_running_loop().time()
            self._recent[run_id] = (now, fields)
            self._recent.move_to_end(run_id)
            while self._recent:
                received, _ = next(iter(self._recent.values()))
                if now - received <= RECENT_S and len(self._recent) <= RECENT_MAX:
                    break
                self._recent.popitem(last=False)
                if now - received <= RECENT_S:
                    self._dropped_at = received
        if run_id in self._waiters:
            self._wake(run_id, RunRecord.from_hash(run_id, fields) if fields else None)

    def _known_end(self, run_id: str, since: float | None) -> tuple[bool, RunRecord | None]:
        """(True, the run if it ended) when the cache alone can tell for a run started at
        ``since``; (False, None) when the run must be read."""
        hit = self._recent.get(run_id)
        if hit is not None:
            return True, RunRecord.from_hash(run_id, hit[1])
        complete = self._complete_since
        if since is None or complete is None or since < complete or since <= self._dropped_at:
            return False, None
        return asyncio.get_running_loop().time() - since < RECENT_S, None

    def _wake(self, run_id: str, ended: RunRecord | None = None) -> None:
        for fut in self._waiters.pop(run_id, ()):
            if not fut.done():
                fut.set_result(ended)

    def _wake_all(self) -> None:
        for run_id in list(self._waiters):
            self._wake(run_id)

    async def fetch(self, run_id: str) -> RunRecord | None:
        """The run as stored, read on this waiter's (async) connection, and marked as
        waited for: its end, if still to come, is published (`WATCH_RUN`)."""
        try:
            flat = await self._watch_run(keys=[self.ks.run(run_id)])
        except NoScriptError as exc:  # unknown even once loaded again: a failover under it
            raise unavailable(exc) from exc
        return RunRecord.from_hash(run_id, codec.decode_flat_hash(flat)) if flat else None

    async def wait(
        self,
        run_id: str,
        timeout_s: float,
        fetch: Fetch | None = None,
        *,
        since: float | None = None,
    ) -> RunRecord | None:
        """The run once it ends, or its current state when ``timeout_s`` passes first.

        ``fetch`` reads the run (default `fetch`); it must mark the run as waited for, as
        `fetch` does, or the run's end wakes no one before the next poll. ``since`` (loop
        time) is when the caller started the run, if it did so as a watched run."""
        fetch = fetch or self.fetch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        first = True
        while True:
            fut: asyncio.Future[RunRecord | None] = loop.create_future()
            self._waiters[run_id].add(fut)
            try:
                known, rec = self._known_end(run_id, since) if first else (False, None)
                first = False
                if rec is not None:
                    return rec
                remaining = deadline - loop.time()
                if not known or remaining <= 0:
                    rec = await fetch(run_id)
                    remaining = deadline - loop.time()
                    if rec is None or rec.terminal or remaining <= 0:
                        return rec
                # A lost wake-up costs at most one poll interval, never the whole wait.
                with contextlib.suppress(TimeoutError):
                    ended = await asyncio.wait_for(fut, min(remaining, 5.0))
                    if ended is not None and ended.terminal:
                        return ended
            finally:
                self._waiters[run_id].discard(fut)
                if not self._waiters[run_id]:
                    self._waiters.pop(run_id, None)


def _parse_ended(data: object) -> tuple[str, dict[str, str] | None]:
    """A run-ended message: ``{"runId", "run": {hash}}`` (or, from older writers, the id)."""
    text = data.decode() if isinstance(data, bytes) else str(data)
    if not text.startswith("{"):
        return text, None
    try:
        body = codec.loads(text)
        fields = body.get("run")
        return str(body["runId"]), fields if isinstance(fields, dict) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("unreadable run-ended message: %.200s", text)
        return "", None
