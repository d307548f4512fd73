"""Keeping the lane leases of the runs a process executes, all of them in one write.

A run holds its session's lane under a lease (a score in ``sb:idx:leases``) that the
sweep takes back once it lapses: the worker executing the run must keep pushing it
forward. One keeper per process does that for every run in flight, a single
``ZADD XX`` every third of the lease, instead of a timer and a write per run (a worker
with a thousand sub-agents in flight would otherwise make a thousand).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from switchboard.shared.store.runs import RunStore

log = logging.getLogger("switchboard.run")

# Members per ZADD when many lanes are held.
_CHUNK = 1000


class LeaseKeeper:
    """Renews the leases of the lanes this process holds, from one daemon thread."""

    def __init__(self, runs: RunStore) -> None:
        self.runs = runs
        self.interval_s = max(0.5, runs.lease_s / 3)
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    @contextmanager
    def holding(self, session_key: str) -> Iterator[None]:
        """Keep ``session_key``'s lease renewed while the block runs."""
        with self._lock:
            self._held[session_key] += 1
            self._ensure_thread()
        try:
            yield
        finally:
            with self._lock:
                self._held[session_key] -= 1
                if self._held[session_key] <= 0:
                    del self._held[session_key]

    def held(self) -> list[str]:
        """The session keys whose lanes are held now."""
        with self._lock:
            return list(self._held)

    def renew_now(self) -> int:
        """Renew every held lease at once; returns how many."""
        keys = self.held()
        for start in range(0, len(keys), _CHUNK):
            self.runs.renew_leases(keys[start : start + _CHUNK])
        return len(keys)

    def _ensure_thread(self) -> None:
        # Called under the lock. Started in the process that uses it (a thread does not
        # survive a fork), and only while something is held: it ends when nothing is.
        if self._thread is not None and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._keep, name="switchboard-leases", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while True:
            time.sleep(self.interval_s)
            with self._lock:
                if not self._held:
                    self._thread = None
                    return
            try:
                self.renew_now()
            except Exception as exc:  # a store blip: the next turn renews, well inside the lease
                log.warning("renewing lane leases failed: %s", exc)


_keepers: dict[int, LeaseKeeper] = {}
_keepers_lock = threading.Lock()


def keeper_for(runs: RunStore) -> LeaseKeeper:
    """The process's keeper for this store."""
    with _keepers_lock:
        keeper = _keepers.get(id(runs))
        if keeper is None or keeper.runs is not runs:
            keeper = _keepers[id(runs)] = LeaseKeeper(runs)
        return keeper
