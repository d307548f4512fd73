"""Batches of the OpenAI Batches API: what Redis holds so a batch survives any process.

A batch is a hash (`Keyspace.obatch`: endpoint, input file, status, counts, the
admission cursor and cap, its files, timestamps, owner), its validated lines (a list of
plans, one per input line), the run started for each admitted line, the lines in flight
and the lines answered. Admission (`admit`), answering a line (`line_done`), cancelling
and ending (`finalize`) are each one script, so two workers, a retried step or a
restart never admit a line twice nor answer one twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis import Redis

from switchboard.shared.store import codec
from switchboard.shared.store.files import page_of
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts

# Plans written per round trip when a batch is created.
_CHUNK = 1000


@dataclass(frozen=True)
class BatchRecord:
    """One batch as stored."""

    batch_id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    owner: str
    total: int = 0
    completed: int = 0
    failed: int = 0
    cursor: int = 0
    cap: int = 1
    metadata: Mapping[str, str] = field(default_factory=dict)
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    times: Mapping[str, int] = field(default_factory=dict)
    # Why a batch is ending other than by its last line: "expired" (its window passed).
    ending: str | None = None

    def to_hash(self) -> dict[str, str]:
        """The hash fields a new batch is written with."""
        fields: dict[str, Any] = {
            "endpoint": self.endpoint,
            "inputFileId": self.input_file_id,
            "completionWindow": self.completion_window,
            "status": self.status,
            "createdAt": self.created_at,
            "owner": self.owner,
            "total": self.total,
            "completed": self.completed,
            "failed": self.failed,
            "cursor": self.cursor,
            "cap": self.cap,
            "metadata": dict(self.metadata) or None,
            "errors": self.errors,
            **dict(self.times),
        }
        return {k: v for k, v in codec.text_fields(fields).items() if v is not None}

    @classmethod
    def from_hash(cls, batch_id: str, h: Mapping[str, str]) -> BatchRecord:
        """Build from a decoded HGETALL reply."""
        times = {k: int(v) for k, v in h.items() if k.endswith("At") and v.isdigit()}
        return cls(
            batch_id=batch_id,
            endpoint=h.get("endpoint", ""),
            input_file_id=h.get("inputFileId", ""),
            completion_window=h.get("completionWindow", "24h"),
            status=h.get("status", ""),
            created_at=times.get("createdAt", 0),
            owner=h.get("owner", ""),
            total=codec.as_int(h.get("total")) or 0,
            completed=codec.as_int(h.get("completed")) or 0,
            failed=codec.as_int(h.get("failed")) or 0,
            cursor=codec.as_int(h.get("cursor")) or 0,
            cap=codec.as_int(h.get("cap")) or 1,
            metadata=codec.as_json(h.get("metadata"), {}),
            errors=codec.as_json(h.get("errors")),
            output_file_id=h.get("outputFileId"),
            error_file_id=h.get("errorFileId"),
            times=times,
            ending=h.get("ending"),
        )


@dataclass(frozen=True)
class LineDone:
    """What answering a line did: ``applied`` (False: answered before), ``finalize``
    (this answer ended the batch's work: end it), ``admitted`` (the lines admitted in its
    place: start them)."""

    applied: bool
    finalize: bool
    admitted: range = range(0)


class BatchStore:
    """Batches, their lines and their admission (`Keyspace.obatch*`, `batches_of`)."""

    def __init__(self, redis: Redis, ks: Keyspace, *, ttl_s: int) -> None:
        self.redis = redis
        self.ks = ks
        self.ttl_s = ttl_s
        self._lua = LuaScripts(redis)

    def add_plans(self, batch_id: str, plans: Iterable[str]) -> int:
        """Write a new batch's lines (as plans), a page per round trip; how many."""
        plan_key = self.ks.obatch_plans(batch_id)
        chunk: list[str] = []
        count = 0
        for plan in plans:
            chunk.append(plan)
            count += 1
            if len(chunk) >= _CHUNK:
                self._push(plan_key, chunk)
                chunk = []
        self._push(plan_key, chunk)
        return count

    def drop_plans(self, batch_id: str) -> None:
        """Drop the plans of a batch that will not run (it failed its validation)."""
        self.redis.delete(self.ks.obatch_plans(batch_id))

    def create(self, rec: BatchRecord) -> None:
        """Write the batch (its plans written already), listed for its owner and, unless
        it has ended already, among the live batches."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(self.ks.obatch(rec.batch_id), mapping=rec.to_hash())  # type: ignore[arg-type]
        pipe.expire(self.ks.obatch(rec.batch_id), self.ttl_s)
        score = time.time() * 1000  # ms: batches made in the same second keep their order
        pipe.zadd(self.ks.batches_of(rec.owner), {rec.batch_id: score})
        pipe.expire(self.ks.batches_of(rec.owner), self.ttl_s)
        if rec.status == "in_progress":
            pipe.zadd(self.ks.batches_active, {rec.batch_id: score})
        pipe.execute()

    def _push(self, key: str, plans: list[str]) -> None:
        if plans:
            pipe = self.redis.pipeline(transaction=False)
            pipe.rpush(key, *plans)
            pipe.expire(key, self.ttl_s)
            pipe.execute()

    def get(self, batch_id: str) -> BatchRecord | None:
        """The batch, or None when unknown or expired."""
        raw = self.redis.hgetall(self.ks.obatch(batch_id))
        return BatchRecord.from_hash(batch_id, codec.decode_hash(raw)) if raw else None

    def get_many(self, batch_ids: Sequence[str]) -> list[BatchRecord | None]:
        """The records of many batches in one round trip (None where unknown or expired)."""
        pipe = self.redis.pipeline(transaction=False)
        for batch_id in batch_ids:
            pipe.hgetall(self.ks.obatch(batch_id))
        return [
            BatchRecord.from_hash(batch_id, codec.decode_hash(raw)) if raw else None
            for batch_id, raw in zip(batch_ids, pipe.execute(), strict=True)
        ]

    def page(self, owner: str, *, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` of an owner's batch ids after ``after``, newest first."""
        return page_of(self.redis, self.ks.batches_of(owner), after, limit, True)

    def live(self) -> list[str]:
        """The batches not yet ended (the sweep advances each)."""
        return [codec.as_text(m) for m in self.redis.zrange(self.ks.batches_active, 0, -1)]

    def plan(self, batch_id: str, line: int) -> str | None:
        """Line ``line``'s plan (JSON), or None."""
        raw = self.redis.lindex(self.ks.obatch_plans(batch_id), line)
        return codec.as_text(raw) if raw is not None else None

    def plans(self, batch_id: str, first: int, count: int) -> list[str]:
        """The plans of ``count`` lines from ``first``."""
        raw = self.redis.lrange(self.ks.obatch_plans(batch_id), first, first + count - 1)
        return [codec.as_text(p) for p in raw]

    def admit(self, batch_id: str) -> range:
        """Admit the next lines up to the batch's cap (none unless it is in progress)."""
        first, n = self._lua["obatch_admit"](
            batch=self.ks.obatch(batch_id),
            inflight=self.ks.obatch_inflight(batch_id),
            now_ms=int(time.time() * 1000),
        )
        return range(int(first), int(first) + int(n))

    def run_of(self, batch_id: str, line: int) -> str | None:
        """The run started for a line, if one was."""
        raw = self.redis.hget(self.ks.obatch_runs(batch_id), str(line))
        return codec.as_text(raw) if raw is not None else None

    def in_flight(
        self, batch_id: str, *, admitted_before_ms: int | None = None
    ) -> dict[int, str | None]:
        """The lines admitted and not answered (only those admitted before
        ``admitted_before_ms`` when given), each with its run (None: none recorded)."""
        top = "+inf" if admitted_before_ms is None else f"({admitted_before_ms}"
        members = self.redis.zrangebyscore(self.ks.obatch_inflight(batch_id), "-inf", top)
        lines = sorted(int(codec.as_text(m)) for m in members)
        if not lines:
            return {}
        runs = self.redis.hmget(self.ks.obatch_runs(batch_id), [str(n) for n in lines])
        return {
            n: codec.as_text(r) if r is not None else None for n, r in zip(lines, runs, strict=True)
        }

    def line_done(self, batch_id: str, line: int, *, ok: bool, text: str, now_s: int) -> LineDone:
        """Answer a line (its output or error line), once."""
        applied, finalize, first, n = self._lua["obatch_line_done"](
            batch=self.ks.obatch(batch_id),
            done=self.ks.obatch_done(batch_id),
            inflight=self.ks.obatch_inflight(batch_id),
            out=self.ks.obatch_out(batch_id),
            err=self.ks.obatch_err(batch_id),
            line=line,
            kind="out" if ok else "err",
            text=text,
            now_s=now_s,
            now_ms=int(time.time() * 1000),
        )
        admitted = range(int(first), int(first) + int(n))
        return LineDone(bool(int(applied)), bool(int(finalize)), admitted)

    def expire(self, batch_id: str, now_s: int) -> bool:
        """Stop a running batch past its window (`finalizing`, ending `expired`); True
        when this call did."""
        return bool(int(self._lua["obatch_expire"](batch=self.ks.obatch(batch_id), now_s=now_s)))

    def answer_many(
        self, batch_id: str, lines: Sequence[tuple[int, str]], *, ok: bool, now_s: int
    ) -> int:
        """Answer many lines (each once) in one round trip: lines never admitted; how
        many were answered by this call."""
        pipe = self.redis.pipeline(transaction=False)
        ks = self.ks
        for line, text in lines:
            self._lua["obatch_line_done"](
                batch=ks.obatch(batch_id),
                done=ks.obatch_done(batch_id),
                inflight=ks.obatch_inflight(batch_id),
                out=ks.obatch_out(batch_id),
                err=ks.obatch_err(batch_id),
                line=line,
                kind="out" if ok else "err",
                text=text,
                now_s=now_s,
                now_ms=int(time.time() * 1000),
                client=pipe,
            )
        return sum(int(reply[0]) for reply in pipe.execute())

    def cancel(self, batch_id: str, now_s: int) -> tuple[str, bool]:
        """Stop admitting (status `cancelling`); (status after, whether to end it now)."""
        status, finalize = self._lua["obatch_cancel"](
            batch=self.ks.obatch(batch_id), inflight=self.ks.obatch_inflight(batch_id), now_s=now_s
        )
        return codec.as_text(status), bool(int(finalize))

    def finalize(self, rec: BatchRecord, out_id: str, err_id: str, now_s: int) -> bool:
        """End a finalizing or emptied cancelling batch: its lines become files."""
        b = rec.batch_id
        ks = self.ks
        made = self._lua["obatch_finalize"](
            batch=ks.obatch(b),
            out=ks.obatch_out(b),
            err=ks.obatch_err(b),
            out_file=ks.file(out_id),
            out_lines=ks.file_lines(out_id),
            err_file=ks.file(err_id),
            err_lines=ks.file_lines(err_id),
            files=ks.files_of(rec.owner),
            live=ks.batches_active,
            plans=ks.obatch_plans(b),
            runs=ks.obatch_runs(b),
            inflight=ks.obatch_inflight(b),
            done=ks.obatch_done(b),
            batch_id=b,
            out_id=out_id,
            err_id=err_id,
            now_s=now_s,
            ttl_s=self.ttl_s,
            owner=rec.owner,
        )
        return bool(int(made))
