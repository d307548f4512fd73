"""Bulk reads and writes of whole datasets: a million sessions, a long transcript.

For setting up (and fully scanning) data at a scale no single request touches: the
benchmark's listing and history datasets. Writes copy the layout the store itself keeps
(the session hash, the sessionId index, the updatedAt indexes for all / agent / kind, the
transcript stream with ``<seq>-0`` ids and field ``m``), and go out pipelined on a
connection of their own as raw RESP in large batches: building the commands with the
client library costs more than Redis spends executing them.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, cast

from redis import Redis
from redis.exceptions import RedisError, ResponseError

from switchboard.shared.store.client import dedicated_connection, unavailable
from switchboard.shared.store.keyspace import Keyspace

CHUNK = 5000
# The session fields a loaded row sets itself; the template gives every other field.
_VARYING = ("sessionId", "createdAt", "updatedAt", "chatType")

Advance = Callable[[int], None]


class SessionRow(NamedTuple):
    """One session to write: what differs between loaded sessions."""

    key: str
    agent_id: str
    kind: str
    session_id: str
    created_at_ms: int
    updated_at_ms: int
    chat_type: str


class BulkLoader:
    """Reads and writes of whole datasets, in batches of ``CHUNK``."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks

    def session_fields(self, key: str) -> dict[str, str]:
        """The stored fields of one session (a template for `write_sessions`)."""
        raw = cast(dict[bytes, bytes], self.redis.hgetall(self.ks.session(key)))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def transcript_payloads(self, key: str) -> list[bytes]:
        """The stored messages of one transcript, as stored (JSON bytes), oldest first."""
        entries = cast(
            list[tuple[bytes, dict[bytes, bytes]]], self.redis.xrange(self.ks.transcript(key))
        )
        return [fields[b"m"] for _, fields in entries]

    def write_sessions(
        self, template: Mapping[str, str], rows: Iterable[SessionRow], *, advance: Advance
    ) -> None:
        """Write a session per row, with the template's other fields, and index each.

        ``advance`` is called with the number of sessions written after each batch."""
        fields = {k: v for k, v in template.items() if k not in _VARYING}
        const = b"".join(_bulk(k.encode()) + _bulk(v.encode()) for k, v in fields.items())
        head = b"*%d\r\n$4\r\nHSET\r\n" % (2 + 2 * (len(fields) + len(_VARYING)))
        names = [_bulk(name.encode()) for name in _VARYING]
        with _GroupPipes(self.redis, self.ks) as pipes:
            for batch in _batches(rows, CHUNK):
                self._write_batch(pipes, batch, head=head, names=names, const=const)
                pipes.flush()
                advance(len(batch))

    def _write_batch(
        self,
        pipes: _GroupPipes,
        batch: Sequence[SessionRow],
        *,
        head: bytes,
        names: Sequence[bytes],
        const: bytes,
    ) -> None:
        by_sid: dict[str, list[bytes]] = defaultdict(list)
        by_all: dict[str, list[bytes]] = defaultdict(list)
        by_agent: dict[str, list[bytes]] = defaultdict(list)
        by_kind: dict[str, list[bytes]] = defaultdict(list)
        for row in batch:
            key = row.key.encode()
            sid = row.session_id.encode()
            updated = b"%d" % row.updated_at_ms
            values = (sid, b"%d" % row.created_at_ms, updated, row.chat_type.encode())
            varying = b"".join(n + _bulk(v) for n, v in zip(names, values, strict=True))
            session = self.ks.session(row.key)
            pipes.add(session, head + _bulk(session.encode()) + varying + const)
            member = _bulk(updated) + _bulk(key)
            group = self.ks.beside(row.key)
            by_sid[self.ks.session_ids_of(row.session_id)].append(_bulk(sid) + _bulk(key))
            by_all[group.updated_all].append(member)
            by_agent[group.updated_agent(row.agent_id)].append(member)
            by_kind[group.updated_kind(row.agent_id, row.kind)].append(member)
        for index, pairs in by_sid.items():
            pipes.add(index, _pairs(b"HSET", index, pairs))
        for indexes in (by_all, by_agent, by_kind):
            for index, members in indexes.items():
                pipes.add(index, _pairs(b"ZADD", index, members))

    def extend_transcript(
        self, key: str, payloads: Sequence[bytes], count: int, *, advance: Advance
    ) -> None:
        """Make ``key``'s transcript ``count`` messages long by repeating ``payloads``
        (and set the session's sequence number to match)."""
        stream = self.ks.transcript(key)
        have = int(self.redis.xlen(stream))
        for start in range(have + 1, count + 1, CHUNK):
            stop = min(count, start + CHUNK - 1)
            pipe = self.redis.pipeline(transaction=False)
            for seq in range(start, stop + 1):
                payload = payloads[(seq - 1) % len(payloads)]
                pipe.xadd(stream, {"m": payload}, id=f"{seq}-0")
            pipe.execute()
            advance(stop - start + 1)
        self.redis.hset(self.ks.session(key), "seq", str(count))

    def scan_sessions(self) -> Iterator[tuple[bytes, dict[bytes, bytes]]]:
        """Every stored session as (key, raw hash), newest first, read in batches."""
        pipe = self.redis.pipeline(transaction=False)
        for group in self.ks.every_group():
            pipe.zrevrange(group.updated_all, 0, -1, withscores=True)
        rows = heapq.merge(*pipe.execute(), key=lambda row: -row[1])
        keys = [cast(bytes, key) for key, _ in rows]
        for start in range(0, len(keys), CHUNK):
            chunk = keys[start : start + CHUNK]
            pipe = self.redis.pipeline(transaction=False)
            for key in chunk:
                pipe.hgetall(self.ks.session(key.decode()))
            yield from zip(chunk, pipe.execute(), strict=True)


def _batches(rows: Iterable[SessionRow], size: int) -> Iterator[list[SessionRow]]:
    batch: list[SessionRow] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class _RawPipe:
    """A pipeline on its own connection: RESP bytes in, every reply read (errors raise).
    On a Redis Cluster the connection is to the primary that owns ``key``'s slot, and
    every key written must be in that slot.

    A batch is sent before the replies of the one before it are read, so Redis executes
    while the loader builds the next batch."""

    def __init__(self, redis: Redis, key: str) -> None:
        self.conn = dedicated_connection(redis, key)
        self.buf: list[bytes] = []
        self.unread = 0

    def add(self, command: bytes) -> None:
        self.buf.append(command)

    def flush(self) -> None:
        """Send what was added; read the replies of the previous batch."""
        previous, self.unread = self.unread, len(self.buf)
        try:
            if self.buf:
                self.conn.send_packed_command([b"".join(self.buf)])  # type: ignore[no-untyped-call]
                self.buf.clear()
            self._read(previous)
        except RedisError as exc:
            raise unavailable(exc) from exc

    def _read(self, count: int) -> None:
        for _ in range(count):
            reply = self.conn.read_response()
            if isinstance(reply, ResponseError):
                raise reply

    def __enter__(self) -> _RawPipe:
        try:
            self.conn.connect()  # type: ignore[no-untyped-call]
        except RedisError as exc:
            raise unavailable(exc) from exc
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if exc_info[0] is None:
                self.flush()
                self.flush()  # the replies of the last batch
        finally:
            self.conn.disconnect()  # type: ignore[no-untyped-call]


class _GroupPipes:
    """A `_RawPipe` per slot group written to (each on the connection to where its keys
    are: on a Redis Cluster, the primary that owns the group's slot)."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self.pipes: dict[int, _RawPipe] = {}

    def add(self, key: str, command: bytes) -> None:
        """Queue ``command``, which writes ``key``, on its group's pipe."""
        group = self.ks.group_of(key)
        pipe = self.pipes.get(group)
        if pipe is None:
            pipe = self.pipes[group] = _RawPipe(self.redis, key).__enter__()
        pipe.add(command)

    def flush(self) -> None:
        """Send every pipe's commands; read the replies of their previous batches."""
        for pipe in self.pipes.values():
            pipe.flush()

    def __enter__(self) -> _GroupPipes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for pipe in self.pipes.values():
            pipe.__exit__(*exc_info)


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _pairs(command: bytes, key: str, pairs: list[bytes]) -> bytes:
    """``command key`` followed by pre-encoded argument pairs (field value / score member)."""
    head = b"*%d\r\n" % (2 + 2 * len(pairs)) + _bulk(command) + _bulk(key.encode())
    return head + b"".join(pairs)
