"""A process's copy of the last messages of the sessions it runs: history read incrementally.

A run sees the last ``HISTORY_LIMIT`` messages of its session's transcript. Reading and
converting all of them for every run made a run's cost grow with the session. Instead the
process keeps, per session, the window of messages it last read (`Window`), and a claim
asks Redis only for the messages after that window's newest sequence number.

Exactness rests on what a transcript is: an append-only stream whose entries are numbered
by the session's counter (``<seq>-0``), under one ``sessionId``. A window is named by
``(sessionId, seq)``; the claim script checks both against the session hash in the same
step (the session still has that sessionId, and its counter has reached ``seq``) and then
answers only the entries after ``seq``, or, when they do not match, the whole window as
before. A session deleted and created again has a new sessionId (a transcript replaced
in place must get one too, as OpenClaw's `sessions.reset` gives a reset session), so no
copy of the old one is ever used for it. A merge only ever combines a window with what
the same stream answered after it, so a window always holds exactly the stream's last
messages up to its ``seq``.

Memory is bounded: at most ``max_sessions`` windows and ``max_bytes`` in all, an entry
weighing its stored JSON plus ``ENTRY_OVERHEAD`` (what a short message's dict and model
form took, measured with tracemalloc: about 1.75 KB); the least recently used sessions are
dropped first. Each entry also keeps a slot (``memo``)
where a caller keeps what it derived from the message (the runtime: its model form), so
that is made once per message, not once per run, and dropped with the entry.

The windows are read and written under a lock (a worker runs runs on several threads);
the entries themselves are shared by the runs that read them and never changed, except
their ``memo``, set once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

__all__ = [
    "ENTRY_OVERHEAD",
    "MAX_BYTES",
    "MAX_SESSIONS",
    "HistoryEntry",
    "TranscriptWindows",
    "Window",
]

# The bounds of one process's windows: sessions, and the weight of all their entries
# (64 MB: about 35,000 short messages, or 175 sessions holding a full window of 200).
MAX_SESSIONS = 2_000
MAX_BYTES = 64 * 1024 * 1024
# An entry's weight beyond its stored JSON: its decoded dict and its model form.
ENTRY_OVERHEAD = 1_800


class HistoryEntry:
    """One transcript message as read (``message``: the decoded JSON with its ``seq``),
    and what a caller derived from it (``memo``: set once, None until then)."""

    __slots__ = ("memo", "message", "seq", "weight")

    def __init__(self, seq: int, message: dict[str, Any], stored_bytes: int = 0) -> None:
        self.seq = seq
        self.message = message
        self.weight = stored_bytes + ENTRY_OVERHEAD
        self.memo: Any = None

    def __repr__(self) -> str:
        return f"HistoryEntry(seq={self.seq}, role={self.message.get('role')!r})"


@dataclass(frozen=True)
class Window:
    """The last messages of a session's transcript up to ``seq``, under ``session_id``:
    the last ``limit`` of them, or all of them when it holds fewer."""

    session_id: str
    seq: int
    limit: int
    entries: tuple[HistoryEntry, ...]

    @cached_property
    def weight(self) -> int:
        """What its entries weigh (`HistoryEntry.weight`)."""
        return sum(e.weight for e in self.entries)

    def serves(self, limit: int) -> bool:
        """Whether this window holds the last ``limit`` messages up to its seq."""
        return limit <= self.limit or len(self.entries) < self.limit


class TranscriptWindows:
    """Per-session windows of recent transcript messages, least recently used dropped."""

    def __init__(self, *, max_sessions: int = MAX_SESSIONS, max_bytes: int = MAX_BYTES):
        if max_sessions < 1 or max_bytes < 1:
            raise ValueError("a window cache holds at least one session and one byte")
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self._windows: OrderedDict[str, Window] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()
        # How claims went: answered from a window plus the newer messages, or read whole.
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._windows)

    @property
    def weight(self) -> int:
        """What the windows held weigh (bytes, as `HistoryEntry.weight` counts)."""
        return self._weight

    def base(self, key: str, limit: int) -> Window | None:
        """The window a claim of ``limit`` messages of ``key`` can start from, or None."""
        with self._lock:
            window = self._windows.get(key)
            if window is None or not window.serves(limit):
                return None
            self._windows.move_to_end(key)
            return window

    def merge(
        self,
        key: str,
        session_id: str,
        rows: Sequence[HistoryEntry],
        *,
        base: Window | None,
        after: int | None,
        limit: int,
    ) -> tuple[HistoryEntry, ...]:
        """The last ``limit`` messages, from what a claim answered: ``rows`` (oldest first)
        are the messages after ``after`` when the claim accepted ``base`` (``after`` is its
        seq), else (``after`` None) the last ``limit`` messages themselves. Keeps the
        result as the session's window when it is at least as new as the one held."""
        if after is not None:
            if base is None or after != base.seq or session_id != base.session_id:
                raise ValueError(f"a claim answered after seq {after}, not after this window")
            if len(rows) >= limit:  # the new messages alone fill the window
                window = Window(session_id, rows[-1].seq, limit, tuple(rows[-limit:]))
            else:
                keep = max(limit, base.limit)
                merged = (*base.entries, *rows)[-keep:]
                seq = rows[-1].seq if rows else base.seq
                window = Window(session_id, seq, keep, merged)
        else:
            seq = rows[-1].seq if rows else 0
            window = Window(session_id, seq, limit, tuple(rows[-limit:]))
        self._keep(key, window, hit=after is not None)
        return window.entries[-limit:]

    def extend(self, key: str, session_id: str, rows: Sequence[HistoryEntry]) -> None:
        """Append the messages a step just wrote (``rows``, oldest first, numbered on from
        the session's counter) to the session's window, when the window is the stream's up
        to just before them (same sessionId, its seq the one before the first row): the
        next claim then reads none of them. Any other window is left as it is (a claim
        reads what it lacks)."""
        if not rows:
            return
        with self._lock:
            window = self._windows.get(key)
            if window is None or window.session_id != session_id or window.seq != rows[0].seq - 1:
                return
            entries = (*window.entries, *rows)[-window.limit :]
            grown = Window(session_id, rows[-1].seq, window.limit, entries)
            self._weight += grown.weight - window.weight
            self._windows[key] = grown
            self._windows.move_to_end(key)
            self._trim()

    def drop(self, key: str) -> None:
        """Forget a session's window."""
        with self._lock:
            old = self._windows.pop(key, None)
            if old is not None:
                self._weight -= old.weight

    def _keep(self, key: str, window: Window, *, hit: bool) -> None:
        with self._lock:
            if hit:
                self.hits += 1
            else:
                self.misses += 1
            old = self._windows.get(key)
            if old is not None and old.session_id == window.session_id and old.seq > window.seq:
                return  # a newer read of the same transcript got there first
            if old is not None:
                self._weight -= old.weight
            self._windows[key] = window
            self._windows.move_to_end(key)
            self._weight += window.weight
            self._trim()

    def _trim(self) -> None:
        """Drop the least recently used windows past the bounds (the lock held)."""
        while self._windows and (
            len(self._windows) > self.max_sessions or self._weight > self.max_bytes
        ):
            _, dropped = self._windows.popitem(last=False)
            self._weight -= dropped.weight
