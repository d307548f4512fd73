"""Transcripts as Redis streams: one entry per message, stream id ``<seq>-0``.

Appends happen inside the run scripts (so they are exactly-once with the run's state
change); this module reads, and appends for callers outside a run (announces, notes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from redis import Redis
from redis.client import Pipeline

from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts


def _decode(entry_id: bytes | str, fields: Mapping[bytes | str, bytes | str]) -> dict[str, Any]:
    raw = fields.get(b"m") or fields.get("m")
    msg: dict[str, Any] = codec.loads(raw) if raw else {}
    seq = int(as_text(entry_id).split("-", 1)[0])
    msg["__openclaw"] = {"seq": seq}
    return msg


def decode_entries(rows: Sequence[Any], *, newest_first: bool = False) -> list[dict[str, Any]]:
    """Stream entries (``[id, [field, value, ...]]`` or ``(id, {field: value})``) as messages,
    oldest first."""
    out = []
    for entry_id, fields in reversed(rows) if newest_first else rows:
        if not isinstance(fields, Mapping):
            fields = {fields[i]: fields[i + 1] for i in range(0, len(fields) - 1, 2)}
        out.append(_decode(entry_id, fields))
    return out


class TranscriptStore:
    """Reads (and out-of-run appends) of session transcripts."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._lua = LuaScripts(redis)

    def tail(self, key: str, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` messages, oldest first."""
        rows: list[Any] = self.redis.xrevrange(self.ks.transcript(key), count=limit) or []
        return decode_entries(rows, newest_first=True)

    def all(self, key: str) -> list[dict[str, Any]]:
        """Every message, oldest first."""
        rows: list[Any] = self.redis.xrange(self.ks.transcript(key)) or []
        return [_decode(i, f) for i, f in rows]

    def pages(self, key: str, page_size: int = 500) -> Iterator[list[dict[str, Any]]]:
        """Every message, oldest first, ``page_size`` at a time (one XRANGE per page)."""
        start = "-"
        while True:
            rows: list[Any] = (
                self.redis.xrange(self.ks.transcript(key), min=start, count=page_size) or []
            )
            if not rows:
                return
            yield [_decode(i, f) for i, f in rows]
            if len(rows) < page_size:
                return
            start = f"({as_text(rows[-1][0])}"

    def after(self, key: str, seq: int) -> list[dict[str, Any]]:
        """Messages with a sequence number above ``seq``."""
        rows: list[Any] = self.redis.xrange(self.ks.transcript(key), min=f"({seq}-0") or []
        return [_decode(i, f) for i, f in rows]

    def length(self, key: str) -> int:
        """Number of messages."""
        return int(self.redis.xlen(self.ks.transcript(key)))

    def fork(
        self, source: str, key: str, limit: int, now_ms: int, *, client: Pipeline | None = None
    ) -> int | None:
        """Copy the last ``limit`` messages of ``source``'s transcript to the end of
        ``key``'s, in one step; answers how many (None when queued on ``client``)."""
        res = self._lua["transcript_fork"](
            source=self.ks.transcript(source),
            session=self.ks.session(key),
            transcript=self.ks.transcript(key),
            limit=limit,
            now=now_ms,
            client=client,
        )
        return None if client is not None else int(res)

    def append(self, key: str, message: Mapping[str, Any], now_ms: int) -> int:
        """Append one message outside a run; returns its sequence number."""
        seq = self._lua["transcript_append"](
            session=self.ks.session(key),
            transcript=self.ks.transcript(key),
            message=codec.dumps(dict(message)),
            now=now_ms,
        )
        return int(seq)
