"""Files of the OpenAI Files API: uploaded batch inputs and the batches' output files.

A file is a hash (`Keyspace.file`: filename, purpose, size, line count, owner, creation)
and its lines, a list (`Keyspace.file_lines`), so a batch reads its line ``n`` without
reading the rest and a download is sent a page of lines at a time. This is the one
interface the Files API and the batches see: an object store can later fill it. Every
key expires ``ttl_s`` after the file is written.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from redis import Redis

from switchboard.shared.store import codec
from switchboard.shared.store.keyspace import Keyspace

# Lines read per round trip when a file is read through (a download, a validation).
PAGE_LINES = 1000


@dataclass(frozen=True)
class FileRecord:
    """One file as stored (its lines apart)."""

    file_id: str
    filename: str
    purpose: str
    bytes: int
    lines: int
    created_at: int  # seconds
    owner: str
    expires_at: int | None = None

    def to_hash(self) -> dict[str, str]:
        """The hash fields."""
        fields = {
            "filename": self.filename,
            "purpose": self.purpose,
            "bytes": self.bytes,
            "lines": self.lines,
            "createdAt": self.created_at,
            "owner": self.owner,
            "expiresAt": self.expires_at,
        }
        return {k: v for k, v in codec.text_fields(fields).items() if v is not None}

    @classmethod
    def from_hash(cls, file_id: str, h: Mapping[str, str]) -> FileRecord:
        """Build from a decoded HGETALL reply."""
        return cls(
            file_id=file_id,
            filename=h.get("filename", ""),
            purpose=h.get("purpose", ""),
            bytes=codec.as_int(h.get("bytes")) or 0,
            lines=codec.as_int(h.get("lines")) or 0,
            created_at=codec.as_int(h.get("createdAt")) or 0,
            owner=h.get("owner", ""),
            expires_at=codec.as_int(h.get("expiresAt")),
        )


class FileUpload:
    """A file being written, lines appended as they arrive (`FileStore.begin`): its lines
    expire with the file's TTL from the first append, so an upload abandoned halfway
    leaves nothing behind for long."""

    def __init__(self, store: FileStore, file_id: str) -> None:
        self.store = store
        self.file_id = file_id
        self.lines = 0
        self.bytes = 0

    def append(self, lines: list[bytes]) -> None:
        """Append lines (without their newlines) in one round trip."""
        if not lines:
            return
        key = self.store.ks.file_lines(self.file_id)
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.rpush(key, *lines)
        pipe.expire(key, self.store.ttl_s)
        pipe.execute()
        self.lines += len(lines)

    def abandon(self) -> None:
        """Drop what was written."""
        self.store.redis.delete(self.store.ks.file_lines(self.file_id))


class FileStore:
    """Files and their lines (`Keyspace.file`, `file_lines`, `files_of`)."""

    def __init__(self, redis: Redis, ks: Keyspace, *, ttl_s: int) -> None:
        self.redis = redis
        self.ks = ks
        self.ttl_s = ttl_s

    def begin(self, file_id: str) -> FileUpload:
        """A new file's upload; `commit` makes it a file."""
        return FileUpload(self, file_id)

    def commit(self, rec: FileRecord) -> None:
        """Write a file's record (its lines are written already) and list it for its owner."""
        key = self.ks.file(rec.file_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping=rec.to_hash())  # type: ignore[arg-type]
        pipe.expire(key, self.ttl_s)
        pipe.expire(self.ks.file_lines(rec.file_id), self.ttl_s)
        # ms: files made in the same second keep their order
        pipe.zadd(self.ks.files_of(rec.owner), {rec.file_id: time.time() * 1000})
        pipe.expire(self.ks.files_of(rec.owner), self.ttl_s)
        pipe.execute()

    def get(self, file_id: str) -> FileRecord | None:
        """The file's record, or None when unknown or expired."""
        raw = self.redis.hgetall(self.ks.file(file_id))
        return FileRecord.from_hash(file_id, codec.decode_hash(raw)) if raw else None

    def page(self, owner: str, *, after: str | None, limit: int, newest_first: bool) -> list[str]:
        """Up to ``limit`` of an owner's file ids after ``after`` (an id), by creation."""
        return page_of(self.redis, self.ks.files_of(owner), after, limit, newest_first)

    def delete(self, rec: FileRecord) -> bool:
        """Delete a file and its lines; False when it was gone already."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.ks.file(rec.file_id))
        pipe.delete(self.ks.file_lines(rec.file_id))
        pipe.zrem(self.ks.files_of(rec.owner), rec.file_id)
        return bool(pipe.execute()[0])

    def line(self, file_id: str, index: int) -> bytes | None:
        """Line ``index`` (0-based), or None past the end."""
        raw = self.redis.lindex(self.ks.file_lines(file_id), index)
        return raw if isinstance(raw, bytes) else None

    def read(self, file_id: str, start: int = 0) -> Iterator[list[bytes]]:
        """The file's lines from ``start``, a page (`PAGE_LINES`) at a time."""
        key = self.ks.file_lines(file_id)
        while True:
            page = self.redis.lrange(key, start, start + PAGE_LINES - 1)
            if not page:
                return
            yield [line if isinstance(line, bytes) else line.encode() for line in page]
            if len(page) < PAGE_LINES:
                return
            start += PAGE_LINES


def page_of(
    redis: Redis, index: str, after: str | None, limit: int, newest_first: bool
) -> list[str]:
    """Up to ``limit`` members of a sorted set after member ``after``, newest or oldest first."""
    start = 0
    if after is not None:
        rank = redis.zrevrank(index, after) if newest_first else redis.zrank(index, after)
        if rank is None:
            return []
        start = int(rank) + 1  # type: ignore[arg-type]
    stop = start + limit - 1
    got = redis.zrevrange(index, start, stop) if newest_first else redis.zrange(index, start, stop)
    return [codec.as_text(m) for m in got]
