"""Where a worker's runs execute: its run loop and its runs in flight (`RunHost`).

The worker runs Celery's threads pool, and the runs of a worker process execute as
coroutines on an event loop of its own (`RUN_LOOPS`, one). A pool thread hands a message's
runs to the loop and waits only until each run is claimed (its claim step answered): from
then on the run's state in Redis is all it needs (its lane lease, renewed by the process's
lease keeper; the sweep runs it again if the lease lapses), so the message is acked and
the thread takes the next one while the run goes on. The host keeps up to
``worker_max_in_flight`` runs (`handback.InFlight`, 10,000 unless told otherwise) as idle
coroutines waiting on their model; past that its pool threads wait for runs to end, and
Celery takes no more messages meanwhile. Model clients are bound to the loop that opened
them, so a model has a client (and a connection pool) per loop. Deadlines are enforced by
the product (the executor's timeout), not by Celery.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from celery import Celery
from celery.exceptions import Reject

from switchboard.shared.errors import Unavailable
from switchboard.workers.handback import (
    DEFAULT_MAX_IN_FLIGHT,
    HANDBACK_TIMEOUT_S,
    InFlight,
)

if TYPE_CHECKING:
    from switchboard.workers.follow_ups import Waves

log = logging.getLogger("switchboard.worker")

T = TypeVar("T")

# The event loops a worker process runs its runs on. One: the process is bound by the GIL,
# and every thread that wants it costs a hand-over of the GIL each time one of them blocks
# and wakes, a futex wait and a context switch in the kernel (a quarter of the worker's CPU
# in a `perf` profile of a 10,000-child fan-out on two loops). Measured alternated on 2
# cores, fast paths on, one loop against two (of 4 or 8 store threads each): the worker's
# CPU per child of a 5,000-child fan-out 5.67-6.08 ms against 6.56-7.25 (10,000:
# 5.47-5.83 against 7.18-7.60 ms, all announced in 60-64 s against 75-81 s);
# fire-and-forget sends 262-284/s against 202-219/s (CPU per 1,000 sends 6.6-7.4 s against
# 8.4-8.6 s); send+wait latency alike (p50 9.6 against 9.7 ms). What would block the loop
# goes to its store threads (`runtime.off_loop`).
RUN_LOOPS = 1
# Threads per run loop for its runs' blocking work: their tool calls, their end and
# follow-up steps (`runtime.off_loop`); that many wait side by side while the loop goes
# on. Idle ones cost nothing: one loop of 2, 4 or 8 measured alike (5.35-6.08 ms per child
# above).
STORE_THREADS_PER_LOOP = 8


class _RunLoops:
    """The worker process's event loops, each on a daemon thread, started on first use.

    Started lazily in the process that uses them, so a forking pool's children each get
    their own (a loop and its thread never survive a fork)."""

    def __init__(self, count: int, new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self._count = count
        self._new_loop = new_loop
        self._lock = threading.Lock()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._pid = 0
        self._next = itertools.count()

    def close(self) -> None:
        """Stop the loops started here (their runs ended or were handed back), and their
        store threads."""
        with self._lock:
            loops, self._loops = self._loops, []
        for loop in loops:
            if not loop.is_closed():
                loop.call_soon_threadsafe(loop.stop)

    def next(self) -> asyncio.AbstractEventLoop:
        """The loop for the next run (round robin)."""
        with self._lock:
            if (
                not self._loops
                or self._pid != os.getpid()
                or any(loop.is_closed() for loop in self._loops)
            ):
                self._loops = [self._start(self._new_loop(), i) for i in range(self._count)]
                self._pid = os.getpid()
            return self._loops[next(self._next) % self._count]

    @staticmethod
    def _start(loop: asyncio.AbstractEventLoop, index: int) -> asyncio.AbstractEventLoop:
        # Where its runs' blocking store work goes (`off_loop`).
        loop.set_default_executor(
            ThreadPoolExecutor(
                STORE_THREADS_PER_LOOP, thread_name_prefix=f"switchboard-store-{index}"
            )
        )
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_forever()  # until `close`
            loop.close()  # its default executor (the store threads) with it

        threading.Thread(target=serve, name=f"switchboard-runs-{index}", daemon=True).start()
        started.wait()
        return loop


# How long a worker that stops without a signal (an embedding's or a test's worker) waits
# for its runs in flight to end.
DRAIN_TIMEOUT_S = 30.0


class RunHost:
    """Where a worker's runs execute: its run loops and its runs in flight (at most
    ``max_in_flight``, handed back to the queue when the worker stops).

    One per Celery app, made with its tasks (`register_tasks`) from ``Settings`` and kept
    on the app (`run_host`), where the tasks and the pool (`workers.pool`) find it."""

    def __init__(
        self,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        loops: int = RUN_LOOPS,
        new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
        waves: Waves | None = None,
    ) -> None:
        self.loops = _RunLoops(loops, new_loop)
        self.in_flight = InFlight(max_in_flight)
        # What the runs that end in the same turn of their loop share (None: nothing).
        self.waves = waves

    def close(self) -> None:
        """Stop the run loops."""
        self.loops.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start a coroutine on one of the run loops (cancelled if the worker stops)."""
        return asyncio.run_coroutine_threadsafe(self.in_flight.track(coro), self.loops.next())

    def hand_over(self, runs: int, body: Callable[[Claims], Coroutine[Any, Any, None]]) -> None:
        """Start a message's ``runs`` on a run loop (``body`` given their `Claims`);
        return once each was claimed, so the message is acked while its runs go on.

        Waits first for slots while the host has its limit of runs in flight. A run that
        failed before its claim raises here (the message is retried: the claim is
        idempotent); a failure after it is logged (the run's lease lapses and the sweep
        runs it again). A message taken as the worker stops, or whose runs the stop
        cancelled before their claim, goes back to the queue unrun (`Reject`); claimed ones
        are handed back."""
        in_flight = self.in_flight
        if not in_flight.reserve(runs):
            raise Reject("the worker is stopping", requeue=True)  # for another worker
        claims = Claims(runs)
        try:
            future = self.submit(body(claims))
        except BaseException:
            in_flight.release(runs)
            raise
        future.add_done_callback(lambda done: self._ended(done, runs, claims))
        claims.all.wait()
        error = claims.error
        if error is None:
            return
        if isinstance(error, CancelledError | asyncio.CancelledError):
            if in_flight.stopping.is_set():
                # Cancelled before its claim: not one of the runs handed back; its message
                # goes back to the queue as it is, for another worker.
                raise Reject("the worker is stopping", requeue=True) from None
            raise CancelledError("the run was cancelled") from None
        raise error

    def _ended(self, done: Future[None], runs: int, claims: Claims) -> None:
        """A message's coroutine ended (on its loop): its slots go back; a failure is the
        pool thread's if it still waits, else it is logged here."""
        self.in_flight.release(runs)
        error: BaseException | None = CancelledError() if done.cancelled() else done.exception()
        if claims.end(error) or error is None:
            return
        if isinstance(error, CancelledError | asyncio.CancelledError):
            return  # the worker stops: handed back
        if isinstance(error, Unavailable):
            log.warning(
                "run(s) stopped after their claim (%s): the sweep runs them again once "
                "their lane lease lapses",
                error,
            )
            return
        log.error("run(s) failed after their claim", exc_info=error)

    def wait_for_runs(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """As the pool stops: a worker stopped by a signal waits for its hand-back; one
        stopped otherwise (embedded, a test's) waits for its runs in flight to end, as
        Celery's warm shutdown waits for its tasks."""
        in_flight = self.in_flight
        if in_flight.stopping.is_set():
            in_flight.handed_back.wait(HANDBACK_TIMEOUT_S)
        elif not in_flight.wait_idle(timeout_s):
            log.warning("stopping with %d run(s) still in flight", in_flight.taken)


def run_host(app: Celery | None) -> RunHost | None:
    """The `RunHost` of ``app`` (made by `register_tasks`); None for an app without the
    product's tasks."""
    host = getattr(app, "switchboard_run_host", None)
    return host if isinstance(host, RunHost) else None


class Claimed(Protocol):
    """Told once a run's claim step answered (no error), or that it failed before."""

    def __call__(self, error: BaseException | None = None) -> None: ...


class Claims:
    """The runs of one message not yet claimed. The pool thread that handed them to a run
    loop waits on `all` (set once each run is claimed or the message's coroutine ended),
    then acks the message, or raises `error` (a run that failed before its claim: the
    message is retried)."""

    def __init__(self, count: int) -> None:
        self._lock = threading.Lock()
        self._left = count
        self.error: BaseException | None = None
        self.all = threading.Event()
        if count <= 0:
            self.all.set()

    def run(self) -> Claimed:
        """The callback of one run: counted once, its first call wins."""
        told = False

        def claimed(error: BaseException | None = None) -> None:
            nonlocal told
            with self._lock:
                if told:
                    return
                told = True
                if error is not None and self.error is None:
                    self.error = error
                self._left -= 1
                if self._left <= 0:
                    self.all.set()

        return claimed

    def end(self, error: BaseException | None) -> bool:
        """The message's coroutine ended: True when its pool thread was still waiting
        (it gets ``error``), False when every run had been claimed already."""
        with self._lock:
            if self.all.is_set():
                return False
            if self.error is None:
                self.error = error
            self.all.set()
            return True
