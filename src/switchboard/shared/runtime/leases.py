"""Keeping the lane leases of the runs a process executes, all of them in one write.

A run holds its session's lane under a lease (a score in ``sb:idx:leases``) that the
sweep takes back once it lapses: the worker executing the run must keep pushing it
forward. One keeper per process does that for every run in flight, a single
``ZADD XX`` every third of the lease, instead of a timer and a write per run (a worker
with a thousand sub-agents in flight would otherwise make a thousand).

The keeper also carries cancel requests to the runs it keeps: once a second, while it
holds lanes, it reads the runs `subagents cancel` asked to stop (one read for the whole
process) and calls the stop callback of each one executing here.

A run held with its attempt is renewed fenced (`RunStore.renew_held`): only while it still
holds its lane, runs, and is at that attempt. A process cut off from the store for longer
than the lease finds, once back, that the sweep gave its run to another attempt: the
renewal is refused (logged as a fenced write, never applied) and the run's superseded
callback stops it, so the stale copy makes no more model calls or tool calls.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from switchboard.shared.store.runs import RunStore

log = logging.getLogger("switchboard.run")

# Members per ZADD when many lanes are held.
_CHUNK = 1000
# How often cancel requests are looked for while runs execute here (seconds).
CANCEL_CHECK_S = 1.0
# The start of the log line of every write a newer attempt fenced off (tests count them).
FENCED = "fenced:"
# The start of the log line of a renewal made later than the lease after the last one.
LATE = "late:"

# One holding: (session key, run id or '', attempt or 0).
Held = tuple[str, str, int]


class LeaseKeeper:
    """Renews the leases of the lanes this process holds, from one daemon thread."""

    def __init__(self, runs: RunStore) -> None:
        self.runs = runs
        self.interval_s = max(0.5, runs.lease_s / 3)
        self._held: Counter[Held] = Counter()
        # Fenced holdings whose renewal was refused: not renewed again.
        self._refused: set[Held] = set()
        # Runs executing here stopped when another attempt takes them: (run, attempt) -> stop.
        self._superseded: dict[tuple[str, int], Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        # Runs executing here that a cancel request stops: run id -> stop callback.
        self._stoppable: dict[str, Callable[[], None]] = {}

    @contextmanager
    def holding(
        self,
        session_key: str,
        run_id: str | None = None,
        on_cancel: Callable[[], None] | None = None,
        *,
        attempt: int | None = None,
        on_superseded: Callable[[], None] | None = None,
    ) -> Iterator[None]:
        """Keep ``session_key``'s lease renewed while the block runs; with ``run_id`` and
        ``on_cancel``, call ``on_cancel`` (from the keeper's thread) if that run is asked to
        stop meanwhile. With ``run_id`` and ``attempt`` the renewal is fenced: once it is
        refused (another attempt has the run) ``on_superseded`` is called, once."""
        entry: Held = (session_key, run_id or "", attempt or 0)
        with self._lock:
            self._held[entry] += 1
            if run_id is not None and on_cancel is not None:
                self._stoppable[run_id] = on_cancel
            if run_id is not None and attempt is not None and on_superseded is not None:
                self._superseded[(run_id, attempt)] = on_superseded
            self._ensure_thread()
        try:
            yield
        finally:
            with self._lock:
                self._held[entry] -= 1
                if self._held[entry] <= 0:
                    del self._held[entry]
                    self._refused.discard(entry)
                if run_id is not None:
                    # Only this block's own callback: a later attempt of the same run may
                    # have registered its own while this one was unwinding.
                    if on_cancel is not None and self._stoppable.get(run_id) is on_cancel:
                        del self._stoppable[run_id]
                    if attempt is not None:
                        self._superseded.pop((run_id, attempt), None)

    def check_cancels(self) -> int:
        """Call the stop callback of every run executing here that was asked to stop;
        returns how many."""
        with self._lock:
            if not self._stoppable:
                return 0
        asked = self.runs.cancel_requests()
        with self._lock:
            stops = [self._stoppable.pop(r) for r in asked if r in self._stoppable]
        for stop in stops:
            try:
                stop()
            except Exception:  # one run's stop must not keep the others running
                log.exception("stopping a cancelled run failed")
        return len(stops)

    def held(self) -> list[str]:
        """The session keys whose lanes are held now."""
        with self._lock:
            return list(dict.fromkeys(key for key, _, _ in self._held))

    def held_runs(self) -> list[Held]:
        """The fenced holdings now: (session key, run id, attempt) of each run held with
        its attempt whose renewal has not been refused."""
        with self._lock:
            return [h for h in self._held if h[1] and h[2] and h not in self._refused]

    def renew_now(self) -> int:
        """Renew every held lease at once (fenced where the run's attempt is known);
        returns how many were renewed. A refused renewal is logged as a fenced write and
        stops its run (its superseded callback)."""
        with self._lock:
            fenced = [h for h in self._held if h[1] and h[2] and h not in self._refused]
            plain = list(
                dict.fromkeys(key for key, run_id, att in self._held if not (run_id and att))
            )
        for start in range(0, len(plain), _CHUNK):
            self.runs.renew_leases(plain[start : start + _CHUNK])
        answered: list[Held] = []
        for start in range(0, len(fenced), _CHUNK):
            answered += self.runs.renew_held(fenced[start : start + _CHUNK])
        with self._lock:
            # A holding released while the renewal was on its way was ended here (its run
            # finished, parked or was handed back): refused, but nothing stale is running.
            refused = [h for h in answered if h in self._held]
        for session_key, run_id, attempt in refused:
            log.warning(
                "%s run %s attempt %d: lease renewal refused (another attempt has the run); "
                "stopping it",
                FENCED,
                run_id,
                attempt,
                extra={"runId": run_id, "sessionKey": session_key, "fenced": "lease"},
            )
        with self._lock:
            self._refused.update(h for h in refused if h in self._held)
            stops = [self._superseded.pop((r, a), None) for _, r, a in refused]
        for stop in stops:
            if stop is None:
                continue
            try:
                stop()
            except Exception:  # one run's stop must not keep the others running
                log.exception("stopping a superseded run failed")
        return len(plain) + len(fenced) - len(answered)

    def _ensure_thread(self) -> None:
        # Called under the lock. Started in the process that uses it (a thread does not
        # survive a fork), and only while something is held: it ends when nothing is.
        if self._thread is not None and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._keep, name="switchboard-leases", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        tick = min(self.interval_s, CANCEL_CHECK_S)
        renew_at = time.monotonic() + self.interval_s
        renewed_at = time.monotonic()  # the last renewal answered (or the keeper's start)
        while True:
            time.sleep(tick)
            with self._lock:
                if not self._held:
                    self._thread = None
                    return
            try:
                self.check_cancels()
            except Exception as exc:  # a store blip: the next turn looks again (the renewal
                log.debug("reading cancel requests failed: %s", exc)  # warns of an outage)
            if time.monotonic() < renew_at:
                continue
            renew_at = time.monotonic() + self.interval_s
            try:
                self.renew_now()
            except Exception as exc:  # a store blip: the next turn renews, well inside the lease
                log.warning("renewing lane leases failed: %s", exc)
                continue
            now = time.monotonic()
            gap_s, renewed_at = now - renewed_at, now
            if gap_s > self.runs.lease_s:
                # Held up (a store outage, or a process too busy to run this thread): the
                # sweep may have given runs of this process to another attempt meanwhile.
                log.warning(
                    "%s lane leases renewed %.1f s after the last renewal, past the %g s "
                    "lease (SWITCHBOARD_LANE_LEASE_S)",
                    LATE,
                    gap_s,
                    self.runs.lease_s,
                )


_keepers: dict[int, LeaseKeeper] = {}
_keepers_lock = threading.Lock()


def keeper_for(runs: RunStore) -> LeaseKeeper:
    """The process's keeper for this store."""
    with _keepers_lock:
        keeper = _keepers.get(id(runs))
        if keeper is None or keeper.runs is not runs:
            keeper = _keepers[id(runs)] = LeaseKeeper(runs)
        return keeper
