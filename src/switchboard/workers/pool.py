"""The worker's pool: Celery's threads pool with all of its threads started up front.

Celery's threads pool starts a thread on the first task that finds none idle, and
`Thread.start` waits for the new thread to run. Under load that wait is a turn at the GIL
behind every busy thread, taken by the consumer thread that receives the tasks: a burst
(a batch spawn of a thousand sub-agents) was let in at a few dozen tasks a second. Started
before the first task arrives, the threads cost nothing then.

It watches for revokes of runs' task ids while it runs (`revokes.RevokeWatch`). As it
stops, it waits for the runs the process still has in flight on its run loops, or
for their hand-back when a signal stops the worker (`RunHost.wait_for_runs`): its tasks
return once their runs are claimed, not when they end.

Celery uses it as ``worker_pool`` (see `switchboard.workers.app`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from celery.concurrency import thread

from switchboard.workers.revokes import revoke_watch
from switchboard.workers.run_host import run_host
from switchboard.workers.task_events import task_events

log = logging.getLogger("switchboard.worker")

# Starting threads is quick when nothing else runs; give up waiting (they still start
# lazily, as in Celery's pool) rather than hold the worker's start past this.
PRESTART_TIMEOUT_S = 60.0


class TaskPool(thread.TaskPool):  # type: ignore[misc]
    """Celery's threads pool, every thread started when the pool starts."""

    def on_start(self) -> None:
        super().on_start()
        started = time.monotonic()
        count = prestart(self.executor, self.limit, PRESTART_TIMEOUT_S)
        log.info("started %d pool threads in %.2fs", count, time.monotonic() - started)
        watch = revoke_watch(self.app)
        if watch is not None:  # revokes of runs' task ids cancel the runs from now on
            watch.start()

    def on_stop(self) -> None:
        watch = revoke_watch(self.app)
        if watch is not None:
            watch.stop()
        # The pool's tasks return once their runs are claimed: the runs still going on
        # the run loops are handed back (a signal) or waited for before the pool goes.
        host = run_host(self.app)
        if host is not None:  # an app with the product's tasks
            host.wait_for_runs()
        events = task_events(self.app)
        if events is not None:  # the runs' last events published, its thread stopped
            events.close()
        super().on_stop()


def prestart(executor: thread.ThreadPoolExecutor, count: int, timeout_s: float) -> int:
    """Have ``executor`` start ``count`` threads now; returns how many it has.

    The executor starts a thread for a job only when no thread is idle, so ``count`` jobs
    that all wait until every one of them runs make it start ``count`` threads."""
    gate = threading.Barrier(count, timeout=timeout_s)

    def hold() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            gate.wait()

    futures = [executor.submit(hold) for _ in range(count)]
    for future in futures:
        future.result()
    return len(executor._threads)
