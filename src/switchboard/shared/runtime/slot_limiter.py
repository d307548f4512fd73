"""Waiting for a tool server's slot (its ``maxConcurrent``) without holding a thread,
a connection or a core.

The slots are a semaphore in Redis (`ToolSlotStore`): an acquire answers at once, taken
or not. A call that finds every slot held waits as a coroutine, and how it waits is the
point: a worker keeps thousands of runs on a few event loops, and a thousand of them may
wait on one busy server.

- Within a process the waiting calls of a server queue first come, first served, and only
  the first (the head) asks Redis again; the others sleep on an event of their own. When a
  call of this process gives its slot back, it wakes the head at once, and a head that
  takes a slot wakes the next one, which asks at once too: slots freed together are taken
  together, in one round trip each, and a single worker (the common case) hands its slots
  over with no delay at all.
- A slot freed by another process, or by a lease that lapsed (a dead worker), is found by
  the head's next ask: it asks again after a short backoff with jitter (`MIN_BACKOFF_S`
  doubling to `MAX_BACKOFF_S`, or to `FRONT_BACKOFF_S` while its process is first in the
  server's line), so a process asks Redis at most 10 to 50 times a second per busy
  server, whatever the number of calls waiting.
- Between processes the slots are shared fairly: a process whose calls wait is in the
  server's line in Redis, and a slot given back goes to the process first in line (its
  head's next ask, within `FRONT_BACKOFF_S`), not to the process that gave it back; a
  process that takes one goes to the back of the line. Without the line, a worker's local
  hand-over (at once) would beat another worker's ask (after its backoff) every time, and
  that worker's calls would wait until they timed out.

Why not a blocking pop on a wake list: the store's client is blocking and runs off the loop
(`off_loop`), so each blocked pop would hold a pool thread and a pooled connection for the
whole wait, and a lapsed lease pushes nothing to wake anyone, so a timed ask is needed
anyway. The backoff costs a round trip per process per ``MAX_BACKOFF_S`` at worst and
nothing else.

One `SlotLimiter` per server per process (`limiter_for`): its waiting calls may be on any
of the process's run loops, so its queue is guarded by a lock and a wake crosses loops
with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.runtime.off_loop import off_loop
from switchboard.shared.store.tool_slots import Acquired, ToolSlotStore

log = logging.getLogger("switchboard.tools")

# The head's backoff between two asks while every slot is held (s); shorter while its
# process is first in line (a slot given back elsewhere is its own).
MIN_BACKOFF_S = 0.002
MAX_BACKOFF_S = 0.1
FRONT_BACKOFF_S = 0.02
# How long a slot's lease runs before a call renews it (s): a dead worker's slots come
# back at most this long after it died.
DEFAULT_LEASE_S = 30.0
# A waiting call that is not the head looks again this often (s): only a safety net, the
# head leaving the queue wakes the next one.
_RECHECK_S = 5.0


class NoSlot(Exception):
    """No slot of the server came free within the call's wait."""


@dataclass(eq=False)
class _Waiter:
    """One waiting call: its loop, and the event that wakes it."""

    loop: asyncio.AbstractEventLoop
    woken: asyncio.Event

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # its loop closed: nobody to wake
            self.loop.call_soon_threadsafe(self.woken.set)


class SlotLimiter:
    """The slots of one tool server, as the calls of this process take and give them."""

    def __init__(
        self,
        slots: ToolSlotStore,
        server: str,
        limit: int,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        self.slots = slots
        self.server = server
        self.limit = limit
        self.lease_ms = max(1, int(lease_s * 1000))
        self.max_backoff_s = max_backoff_s
        self._waiters: deque[_Waiter] = deque()
        self._lock = threading.Lock()
        # This process in the server's line (one id per limiter: one per server here).
        self.proc = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"

    async def acquire(
        self, holder: str, timeout_s: float, on_wait: Callable[[int], None] | None = None
    ) -> None:
        """Take a slot for ``holder``, waiting up to ``timeout_s`` (`NoSlot` past it);
        ``on_wait`` is told +1 when the call starts waiting in the queue, -1 when it stops."""
        if not self._waiters and (await self._ask(holder, in_line=False)).taken:
            return
        waiter = _Waiter(asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.append(waiter)
        if on_wait is not None:
            on_wait(1)
        taken = False
        try:
            await self._wait_turn(waiter, holder, time.monotonic() + timeout_s)
            taken = True
        finally:
            if on_wait is not None:
                on_wait(-1)
            if self._leave(waiter) and not taken:  # none of this process waits now
                await self._leave_line()

    async def _wait_turn(self, waiter: _Waiter, holder: str, deadline: float) -> None:
        delay = MIN_BACKOFF_S
        while True:
            pause = _RECHECK_S
            if self._head() is waiter:
                asked = await self._ask(holder, in_line=True)
                if asked.taken:
                    return
                pause = delay * random.uniform(0.5, 1.0)
                cap = FRONT_BACKOFF_S if asked.ahead == 0 else self.max_backoff_s
                delay = min(delay * 2, max(cap, MIN_BACKOFF_S))
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoSlot(
                    f"tool server {self.server!r} is busy: none of its {self.limit} slots "
                    "came free in time"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.woken.wait(), min(pause, left))
                delay = MIN_BACKOFF_S  # a slot was given back here: ask at once
            waiter.woken.clear()

    async def _ask(self, holder: str, *, in_line: bool) -> Acquired:
        """One acquire (``in_line``: as this process, waiting in the server's line; else
        once, behind it); cancelled meanwhile, a slot it took is given back."""
        call = partial(
            self.slots.acquire,
            self.server,
            holder,
            self.limit,
            self.lease_ms,
            proc=self.proc if in_line else "",
            stay=in_line and len(self._waiters) > 1,
        )
        try:
            return await off_loop(call)
        except asyncio.CancelledError:
            with contextlib.suppress(StoreUnavailable):
                await off_loop(partial(self.slots.release, self.server, holder))
            raise

    def _head(self) -> _Waiter | None:
        with self._lock:
            return self._waiters[0] if self._waiters else None

    def _leave(self, waiter: _Waiter) -> bool:
        """Take ``waiter`` out of the queue; if it was the head, the next one is woken.
        True when the queue is empty now."""
        with self._lock:
            was_head = bool(self._waiters) and self._waiters[0] is waiter
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            head = self._waiters[0] if (was_head and self._waiters) else None
            empty = not self._waiters
        if head is not None:
            head.wake()
        return empty

    async def _leave_line(self) -> None:
        """Take this process out of the server's line (else it drops out once unseen)."""
        with contextlib.suppress(StoreUnavailable):
            await off_loop(partial(self.slots.leave, self.server, self.proc))

    async def release(self, holder: str) -> None:
        """Give ``holder``'s slot back and wake this process's first waiting call; with
        the store away the slot comes back when its lease lapses."""
        try:
            await off_loop(partial(self.slots.release, self.server, holder))
        except StoreUnavailable as exc:
            log.warning("tool slot of %s not released (%s): back after its lease", self.server, exc)
        head = self._head()
        if head is not None:
            head.wake()

    def release_soon(self, holder: str) -> None:
        """Give ``holder``'s slot back without waiting for the round trip (the call that
        held it returns at once); this process's first waiting call is woken once it is
        back. The release runs on the loop's executor: a loop shutting down waits for it."""
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(None, partial(self.slots.release, self.server, holder))
        done.add_done_callback(self._released)

    def _released(self, done: asyncio.Future[bool]) -> None:
        exc = None if done.cancelled() else done.exception()
        if exc is not None:
            log.warning("tool slot of %s not released (%s): back after its lease", self.server, exc)
        head = self._head()
        if head is not None:
            head.wake()

    async def keep(self, holder: str) -> None:
        """Renew ``holder``'s lease every third of it until cancelled (the call ended)."""
        every_s = self.lease_ms / 3000
        while True:
            await asyncio.sleep(every_s)
            renew = partial(self.slots.renew, self.server, holder, self.lease_ms)
            try:
                if not await off_loop(renew):
                    log.warning("tool slot lease of %s lapsed under a call", self.server)
                    return
            except StoreUnavailable as exc:
                log.warning("tool slot lease of %s not renewed: %s", self.server, exc)


# The limiters of this process, one per (store, server, limit): every toolset of a server
# shares one queue of waiting calls.
_LIMITERS: dict[tuple[int, str, int], SlotLimiter] = {}
_limiters_lock = threading.Lock()


def limiter_for(
    slots: ToolSlotStore,
    server: str,
    limit: int,
    *,
    lease_s: float = DEFAULT_LEASE_S,
) -> SlotLimiter:
    """This process's limiter of ``server`` at ``limit`` slots (made on first use)."""
    key = (id(slots), server, limit)
    with _limiters_lock:
        limiter = _LIMITERS.get(key)
        if limiter is None or limiter.slots is not slots:
            limiter = SlotLimiter(slots, server, limit, lease_s=lease_s)
            _LIMITERS[key] = limiter
        return limiter
