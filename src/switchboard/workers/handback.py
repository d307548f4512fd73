"""A stopping worker hands its runs back: cancelled here, queued again for another worker.

Runs are durable (the run record, its transcript and its session lane live in Redis), so a
worker told to stop (SIGTERM: a rollout, a scale-down, `docker compose stop`) need not
finish them: it cancels the runs in flight, puts each one back in the queued state and
sends its message again, as the sweep does for a worker that died, only at once rather
than when the lane lease lapses. The worker then exits in seconds, whatever the runs'
deadlines. Flow steps (short) finish as in Celery's warm shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from switchboard.shared.runtime.leases import FENCED, keeper_for
from switchboard.shared.services import Services

log = logging.getLogger("switchboard.worker")

T = TypeVar("T")

# How long the hand-back waits for cancelled runs to unwind (they stop at their next await:
# a model call or a sleep), and how long a pool thread waits for the hand-back to end.
UNWIND_TIMEOUT_S = 10.0
HANDBACK_TIMEOUT_S = 30.0

# Runs one worker process keeps in flight unless told otherwise (`switchboard worker
# --max-in-flight`, SWITCHBOARD_WORKER_MAX_IN_FLIGHT).
DEFAULT_MAX_IN_FLIGHT = 10_000
# How often a worker at its limit says so.
FULL_WARNING_EVERY_S = 30.0

# (session key, the run holding its lane[, the attempt this process executes it as]).
Lanes = list[tuple[str, str] | tuple[str, str, int]]


class InFlight:
    """The run coroutines a worker process executes, how many it may hold, and the
    hand-back when it stops.

    A message's runs take slots (`reserve`) before they go to a run loop and give them
    back as they end (`release`): a pool thread that finds the process at its limit waits
    there, and Celery takes no more messages while its pool threads wait (backpressure).
    """

    def __init__(self, limit: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[asyncio.Task[Any], threading.Event] = {}
        self.stopping = threading.Event()
        self.handed_back = threading.Event()
        self.limit = limit
        self._slots = threading.Condition()
        self._taken = 0
        self.peak = 0
        self._warned_at = 0.0

    @property
    def taken(self) -> int:
        """Runs in flight (handed to a run loop and not ended)."""
        return self._taken

    def reserve(self, count: int) -> bool:
        """Take ``count`` slots, waiting while the process is at its limit (a message with
        more runs than the limit waits for an empty process); False once the worker
        stops (no slot taken)."""
        with self._slots:
            while self._taken > 0 and self._taken + count > self.limit:
                if self.stopping.is_set():
                    return False
                now = time.monotonic()
                if now - self._warned_at > FULL_WARNING_EVERY_S:
                    self._warned_at = now
                    log.warning(
                        "%d run(s) in flight, the limit (max in flight %d): taking no more "
                        "messages until runs end",
                        self._taken,
                        self.limit,
                    )
                self._slots.wait(1.0)
            if self.stopping.is_set():
                return False
            self._taken += count
            self.peak = max(self.peak, self._taken)
            return True

    def release(self, count: int) -> None:
        """Give back the slots of runs that ended."""
        with self._slots:
            self._taken -= count
            self._slots.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no run is in flight; False if some still are after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._slots:
            while self._taken > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._slots.wait(min(left, 1.0))
            return True

    async def track(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` as a run the hand-back can cancel (started after a stop: cancelled)."""
        task = asyncio.current_task()
        assert task is not None
        ended = threading.Event()
        with self._lock:
            self._tasks[task] = ended
        try:
            if self.stopping.is_set():
                coro.close()
                raise asyncio.CancelledError
            return await coro
        finally:
            with self._lock:
                self._tasks.pop(task, None)
            ended.set()

    def stop(self, hand_back: Callable[[Lanes], int], held: Callable[[], Lanes]) -> None:
        """Start the hand-back on a thread of its own (called from a signal handler, which
        must not block on locks the interrupted main thread may hold)."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        with self._slots:
            self._slots.notify_all()  # pool threads waiting for a slot give up
        threading.Thread(
            target=self._hand_back, args=(hand_back, held), name="switchboard-handback"
        ).start()

    def _hand_back(self, hand_back: Callable[[Lanes], int], held: Callable[[], Lanes]) -> None:
        try:
            lanes = held()  # before cancelling: a cancelled run lets go of its lane here
            ended = self._cancel_all()
            for event in ended:
                event.wait(UNWIND_TIMEOUT_S)
            count = hand_back(lanes)
            if count:
                log.warning("stopping: %d run(s) handed back to the queue", count)
        except Exception:  # the sweep recovers them once their leases lapse
            log.exception("handing runs back failed; the sweep will queue them again")
        finally:
            self.handed_back.set()

    def _cancel_all(self) -> list[threading.Event]:
        with self._lock:
            tasks = list(self._tasks.items())
        for task, _ in tasks:
            task.get_loop().call_soon_threadsafe(task.cancel)
        return [ended for _, ended in tasks]


def hand_back_runs(svc: Services, lanes: Lanes) -> int:
    """Queue again the runs of ``lanes`` still running and still holding their lane, and
    send their messages: returns how many. A lane given with its attempt is handed back
    only while the run is at that attempt: a process that was cut off from the store past
    its lease must not queue again a run another worker took over and executes now."""
    runs = svc.store.runs
    count = 0
    for lane in lanes:
        session_key, run_id = lane[0], lane[1]
        attempt = lane[2] if len(lane) > 2 else None
        # A run that ended as it was cancelled stays ended, and the lane's next run (taken
        # by some other worker) is not this process's to hand back (`requeue` would
        # answer "not-running" for it).
        if runs.lane_holder(session_key) != run_id or runs.status(run_id) != "running":
            continue
        verdict = runs.requeue(run_id, attempt)
        if verdict == "moved":
            log.warning(
                "%s run %s attempt %s: hand-back refused (another attempt has the run)",
                FENCED,
                run_id,
                attempt,
                extra={"runId": run_id, "sessionKey": session_key, "fenced": "handback"},
            )
        if verdict not in ("queued", "parked"):
            continue
        runs.renew_lease(session_key)
        if verdict == "parked":  # it had been resumed: resumed again by another worker
            svc.queue.enqueue_resume(run_id, session_key)
        else:
            svc.queue.enqueue_run(run_id, session_key)
        count += 1
    return count


def held_runs(svc: Services) -> Lanes:
    """The lanes this process's runs hold now, each with the run holding it and the
    attempt it executes here (holdings the store refused already are left out)."""
    return list(keeper_for(svc.store.runs).held_runs())
