"""Beat's heartbeat: its scheduler marks in the store, as it ticks, that it is alive.

`check-health --beat` reads the mark: a beat whose scheduling loop stopped (hung on a
broker send, paused, dead) misses it, while a beat with no worker to run its sweep does not
(the sweep's own mark says whether the sweep ran; a missing worker is the worker's check).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.beat import PersistentScheduler

from switchboard.shared.errors import Unavailable
from switchboard.shared.store.runs import now_ms
from switchboard.shared.store.sweeps import SweepStore

log = logging.getLogger("switchboard.beat")

# The field of the beat marks hash (`sb:beat`) the heartbeat writes.
HEARTBEAT = "heartbeat"


def heartbeat_scheduler(marks: SweepStore, every_s: float) -> type[PersistentScheduler]:
    """Celery beat's file-backed scheduler, marking ``HEARTBEAT`` at most every ``every_s``
    and waking at least that often to do so."""

    class HeartbeatScheduler(PersistentScheduler):  # type: ignore[misc]
        """PersistentScheduler whose ticks also write beat's heartbeat."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._next_mark = 0.0
            super().__init__(*args, **kwargs)

        def tick(self, *args: Any, **kwargs: Any) -> float:
            """One scheduler iteration, then the heartbeat when it is due."""
            delay = float(super().tick(*args, **kwargs))
            now = time.monotonic()
            if now >= self._next_mark:
                self._next_mark = now + every_s  # a store away is not asked every tick
                try:
                    marks.mark_ran(HEARTBEAT, now_ms())
                except Unavailable as exc:
                    # Beat's own sends warn of the outage; this line would only repeat it.
                    log.debug("beat heartbeat not written: %s", exc)
            return min(delay, every_s)

    return HeartbeatScheduler
