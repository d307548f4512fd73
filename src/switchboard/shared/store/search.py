"""Searching transcripts: a bounded server-side scan (``lua/transcript_search.lua``).

No index is kept, so an append costs nothing extra; a search reads, per slot group, one
script over at most a bounded number of transcripts and messages each, and only messages
containing one of the needles (ASCII case-insensitive) come back. The caller decides
which transcripts (the visible sessions, newest first) and confirms each candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis

from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts

# Transcripts one script call scans (a script blocks Redis while it runs: keep each short).
_KEYS_PER_CALL = 25


@dataclass(frozen=True)
class Candidate:
    """A message that contains a needle: its session, sequence number and decoded JSON."""

    session_key: str
    seq: int
    message: dict[str, Any]


class SearchStore:
    """Bounded scans of session transcripts for text."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._lua = LuaScripts(redis)

    def scan(
        self, session_keys: Sequence[str], needles: Sequence[str], per_session: int
    ) -> list[Candidate]:
        """The newest ``per_session`` messages of each session that contain a needle (an
        ASCII lower-case plain string), in one pipelined round trip: sessions in the order
        given, each one's messages newest first."""
        if not session_keys or not needles:
            return []
        by_group: dict[int, list[str]] = {}
        for key in session_keys:
            by_group.setdefault(self.ks.group_of_key(key), []).append(key)
        calls: list[list[str]] = []
        pipe = self.redis.pipeline(transaction=False)
        for keys in by_group.values():
            for at in range(0, len(keys), _KEYS_PER_CALL):
                chunk = keys[at : at + _KEYS_PER_CALL]
                calls.append(chunk)
                self._lua["transcript_search"](
                    client=pipe,
                    transcripts=[self.ks.transcript(k) for k in chunk],
                    per_key=per_session,
                    needles=list(needles),
                )
        found: dict[str, list[Candidate]] = {}
        for chunk, replies in zip(calls, pipe.execute(), strict=True):
            for key, flat in zip(chunk, replies, strict=True):
                found[key] = [
                    Candidate(key, int(as_text(flat[i]).split("-", 1)[0]), codec.loads(flat[i + 1]))
                    for i in range(0, len(flat) - 1, 2)
                ]
        return [c for key in session_keys for c in found.get(key, [])]
