"""Searching transcripts: a bounded server-side scan (``lua/transcript_search.lua``).

No index is kept, so an append costs nothing extra. A search is two pipelined round trips:
per slot group, one script over a bounded number of transcripts (and messages each) answers
only the ids and match weights of the messages holding a needle (ASCII case-insensitive);
then the best of them are read whole. The caller decides which transcripts (the visible
sessions, newest first), how many candidates to read, and confirms each one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
    """A message holding a needle: its session, sequence number and weight (1000 when it
    holds the phrase, plus one per needle), and once read, the message."""

    session_key: str
    seq: int
    weight: int
    message: dict[str, Any] = field(default_factory=dict)


class SearchStore:
    """Bounded scans of session transcripts for text."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._lua = LuaScripts(redis)

    def scan(
        self, session_keys: Sequence[str], needles: Sequence[str], phrase: str, per_session: int
    ) -> list[Candidate]:
        """The newest ``per_session`` messages of each session that hold a needle (ASCII
        lower-case plain strings), without their contents, in one pipelined round trip:
        sessions in the order given, each one's messages newest first."""
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
                    phrase=phrase,
                    needles=list(needles),
                )
        found: dict[str, list[Candidate]] = {}
        for chunk, replies in zip(calls, pipe.execute(), strict=True):
            for key, flat in zip(chunk, replies, strict=True):
                found[key] = [
                    Candidate(key, int(as_text(flat[i]).split("-", 1)[0]), int(flat[i + 1]))
                    for i in range(0, len(flat) - 1, 2)
                ]
        return [c for key in session_keys for c in found.get(key, [])]

    def read(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The candidates with their messages, in one pipelined round trip (a message gone
        meanwhile is left out)."""
        pipe = self.redis.pipeline(transaction=False)
        for c in candidates:
            entry = f"{c.seq}-0"
            pipe.xrange(self.ks.transcript(c.session_key), min=entry, max=entry, count=1)
        out = []
        for c, rows in zip(candidates, pipe.execute(), strict=True):
            raw = rows[0][1].get(b"m") or rows[0][1].get("m") if rows else None
            if raw:
                out.append(replace(c, message=codec.loads(raw)))
        return out
