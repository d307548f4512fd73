"""Outbox entries of followed-up runs, cleared together by one thread of the worker.

A run that ends with a follow-up step is filed in its group's outbox by its end step;
once a worker ran the step in place (the inline follow-ups, `workers.tasks`), the entry is
cleared (`RunStore.outbox_done`). Clearing it is bookkeeping, not an outcome: an entry left
there (its worker died first, or the store was away) only makes the sweep enqueue the step
again once it is older than its grace (`sweeper._OUTBOX_GRACE_MS`, 15 s), and steps are
idempotent. So the runs a worker follows up need not each pay a round trip for it.

With the fast paths on, a worker's run host keeps one `OutboxClears`: callers hand it the
run ids (no round trip), and its thread clears what gathered over ``linger_s`` in one round
trip. A fan-out ending hundreds of children a second clears them in a few round trips a
second instead of one per child. (Not `queue.GroupCommit`, which batches the same way but
makes each caller wait for the batch's publish: a clear has no outcome its caller needs,
and one caller is the run loop.) The thread starts with the first entry in the process
that uses it (a forking pool's children start their own) and clears what is left when the
worker stops (`close`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence

__all__ = ["LINGER_S", "OutboxClears"]

log = logging.getLogger("switchboard.worker")

# How long the thread gathers entries after the first one before it clears them.
LINGER_S = 0.05
# How long `close` waits for the last clear.
CLOSE_TIMEOUT_S = 5.0


class OutboxClears:
    """Run ids whose outbox entries are to be cleared, cleared by ``clear`` in batches on
    a daemon thread. ``clear`` must not raise for a store that is away (it logs: the sweep
    takes the entries over)."""

    def __init__(self, clear: Callable[[list[str]], None], *, linger_s: float = LINGER_S) -> None:
        self._clear = clear
        self._linger_s = linger_s
        self._cond = threading.Condition()
        self._pending: list[str] = []
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closed = False
        self.batches = 0  # round trips made (for tests and measurements)

    def add(self, run_ids: Sequence[str]) -> None:
        """Clear these runs' outbox entries soon (at once when the host is closed)."""
        if not run_ids:
            return
        with self._cond:
            if self._closed:
                closed = True
            else:
                closed = False
                waiting = not self._pending  # else the thread is gathering: no wake-up
                self._pending.extend(run_ids)
                self._start()
                if waiting:
                    self._cond.notify()
        if closed:  # after `close`: nothing clears them later
            self._clear(list(run_ids))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Clear what is pending now and stop the thread."""
        with self._cond:
            self._closed = True
            thread = self._thread if self._pid == os.getpid() else None
            self._cond.notify()
        if thread is not None:
            thread.join(timeout_s)

    def _start(self) -> None:
        """Start the thread in this process if it is not running here (called locked)."""
        if self._thread is not None and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._serve, name="switchboard-outbox-clears", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._closed:
                    self._cond.wait(self._linger_s)  # others join this round trip
                run_ids, self._pending = self._pending, []
                closed = self._closed
            if run_ids:
                self.batches += 1
                try:
                    self._clear(run_ids)
                except Exception:  # left to the sweep, as after a worker's death
                    log.exception("clearing %d outbox entries failed", len(run_ids))
            if closed:
                return
