"""Spawn and batch records: the state of sub-agent flows between their steps.

A spawn hash holds one child (who asked, what, how to clean up, the run, the frozen
outcome, the announce state); a batch hash groups the spawns of one fan-out. Every
read-decide-write step is one script (``lua/spawn_*.lua``), so a step that runs twice
(late ack, a retried task, two sweeps) changes nothing the second time:

- ``reserve_children``: the active-children limit is checked and taken in one step;
- ``freeze``: the child's outcome is recorded once, the first writer wins;
- ``append_once``: the announce lands in the requester's transcript exactly once (the
  message and the state change are one step);
- ``count_done``: a batch member counts itself; once all have, exactly one member (the
  same one on a retry) wins the join.

Methods taking ``client`` queue their command on that pipeline (`Store.pipeline`) instead
of sending it, so a flow step writes across stores in one round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.client import Pipeline

from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.due_index import members_due, take_due
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts
from switchboard.shared.store.run_records import RunRecord
from switchboard.shared.store.sessions import SessionEntry

_INT_FIELDS = frozenset(
    {"createdAt", "endedAt", "startedAt", "batchIndex", "runTimeoutSeconds", "depth"}
)
_JSON_FIELDS = frozenset({"requesterOrigin", "usage", "spawnIds"})


@dataclass(frozen=True)
class SpawnRecord:
    """A spawn or batch hash with typed fields (camelCase, as stored)."""

    id: str
    fields: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def get(self, name: str, default: Any = None) -> Any:
        """A field, or the default when absent or empty."""
        value = self.fields.get(name)
        return default if value is None or value == "" else value

    @classmethod
    def from_hash(cls, record_id: str, raw: Mapping[str, str]) -> SpawnRecord:
        """Decode a HGETALL reply."""
        out: dict[str, Any] = {}
        for name, value in raw.items():
            if name in _INT_FIELDS:
                out[name] = codec.as_int(value)
            elif name in _JSON_FIELDS:
                out[name] = codec.as_json(value)
            else:
                out[name] = value
        return cls(id=record_id, fields=out)

    def with_fields(self, fields: Mapping[str, Any]) -> SpawnRecord:
        """The record after ``fields`` were written to its hash (as read back)."""
        return SpawnRecord.from_hash(self.id, {**encode(self.fields), **encode(fields)})


def encode(fields: Mapping[str, Any]) -> dict[str, str]:
    """Fields as a spawn or batch hash stores them (None values left out)."""
    return {k: e for k, v in fields.items() if (e := codec.encode_value(v)) is not None}


@dataclass(frozen=True)
class AnnounceReads:
    """What an announce step reads besides the spawn (`SpawnStore.announce_reads`)."""

    run: RunRecord | None
    # The batch's join mode ("" when the spawn is not in a batch).
    join: str
    lane_holder: str | None
    child_session_id: str | None
    # True unless asked to check and the requester's session is gone.
    requester_exists: bool
    # The requester's entry, when asked for and present.
    requester_entry: SessionEntry | None


class SpawnStore:
    """Spawn hashes, batch hashes, active-children sets, lineage and the archive queue."""

    def __init__(self, redis: Redis, ks: Keyspace, *, retention_s: int) -> None:
        self.redis = redis
        self.ks = ks
        self.retention_s = retention_s
        self._lua = LuaScripts(redis)

    def _on(self, client: Pipeline | None) -> Redis | Pipeline:
        return self.redis if client is None else client

    # -- spawns -----------------------------------------------------------------------
    def create(
        self, spawn_id: str, fields: Mapping[str, Any], *, client: Pipeline | None = None
    ) -> None:
        """Write a new spawn hash (queued on ``client`` when given), listed among its
        requester's spawns (`spawns_of`)."""
        on = self._on(client)
        on.hset(self.ks.spawn(spawn_id), mapping=encode(fields))  # type: ignore[arg-type]
        requester = fields.get("requesterKey")
        if requester:
            index = self.ks.spawns_of(str(requester))
            created = int(fields.get("createdAt") or 0)
            on.zadd(index, {spawn_id: created})
            # Kept while the requester keeps spawning; spawns older than that are gone.
            on.zremrangebyscore(index, "-inf", created - 2 * self.retention_s * 1000)
            on.expire(index, 2 * self.retention_s)

    def get(self, spawn_id: str) -> SpawnRecord | None:
        """A spawn, or None when unknown or expired."""
        raw = self.redis.hgetall(self.ks.spawn(spawn_id))
        return SpawnRecord.from_hash(spawn_id, codec.decode_hash(raw)) if raw else None

    def get_many(self, spawn_ids: Sequence[str]) -> list[SpawnRecord | None]:
        """Several spawns in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for sid in spawn_ids:
            pipe.hgetall(self.ks.spawn(sid))
        return [
            SpawnRecord.from_hash(sid, codec.decode_hash(raw)) if raw else None
            for sid, raw in zip(spawn_ids, pipe.execute(), strict=True)
        ]

    def spawn_ids_of(self, requester: str, *, since_ms: int | None = None) -> list[str]:
        """The spawns ``requester`` made (since ``since_ms``), newest first; some may have
        expired (`get_many` answers None for them)."""
        low = "-inf" if since_ms is None else since_ms
        rows = self.redis.zrevrangebyscore(self.ks.spawns_of(requester), "+inf", low)
        return [as_text(r) for r in rows]

    def spawn_ids_of_many(self, requesters: Sequence[str]) -> list[list[str]]:
        """`spawn_ids_of` for several requesters, in one round trip."""
        if not requesters:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for requester in requesters:
            pipe.zrevrange(self.ks.spawns_of(requester), 0, -1)
        return [[as_text(r) for r in rows] for rows in pipe.execute()]

    def update(
        self, spawn_id: str, fields: Mapping[str, Any], *, client: Pipeline | None = None
    ) -> None:
        """Set fields of a spawn (queued on ``client`` when given)."""
        self._on(client).hset(self.ks.spawn(spawn_id), mapping=encode(fields))  # type: ignore[arg-type]

    def delete(self, spawn_id: str) -> None:
        """Forget a spawn that never started."""
        self.redis.delete(self.ks.spawn(spawn_id))

    def expire(self, spawn_id: str, *, client: Pipeline | None = None) -> None:
        """Keep a finished spawn for ``runs.retentionHours``."""
        self._on(client).expire(self.ks.spawn(spawn_id), self.retention_s)

    def freeze(
        self,
        spawn_id: str,
        fields: Mapping[str, Any],
        guard: str = "outcome",
        *,
        client: Pipeline | None = None,
    ) -> bool:
        """Record the outcome once; False when it was already recorded (True when queued
        on ``client``: its answer is that pipeline's)."""
        res = self._lua["spawn_freeze"](
            spawn=self.ks.spawn(spawn_id),
            guard=guard,
            fields=codec.dumps(encode(fields)),
            client=client,
        )
        return True if client is not None else bool(int(res))

    def cas(self, hash_key: str, field: str, expected: str, new: str) -> bool:
        """Move ``field`` of an existing spawn or batch hash from ``expected`` to ``new``
        (one caller wins)."""
        res = self._lua["spawn_cas"](record=hash_key, field=field, expected=expected, new=new)
        return bool(int(res))

    def queue_cas(
        self, pipe: Pipeline, hash_key: str, field: str, expected: str, new: str
    ) -> Callable[[Sequence[Any]], bool]:
        """`cas` queued on ``pipe``: answers what reads, from the replies of the executed
        pipeline, whether it moved."""
        at = len(pipe)
        self._lua["spawn_cas"](
            client=pipe, record=hash_key, field=field, expected=expected, new=new
        )
        return lambda replies: bool(int(replies[at]))

    def append_once(
        self,
        hash_key: str,
        session_key: str,
        message: Mapping[str, Any],
        *,
        field: str,
        expected: str,
        new: str,
        now_ms: int,
        client: Pipeline | None = None,
    ) -> int | None:
        """Append ``message`` to a transcript while moving ``field`` expected → new.

        Returns the message's sequence number, 0 when the field had moved already, -1
        when the hash is gone; None when queued on ``client``."""
        res = self._lua["spawn_append_once"](
            record=hash_key,
            session=self.ks.session(session_key),
            transcript=self.ks.transcript(session_key),
            field=field,
            expected=expected,
            new=new,
            message=codec.dumps(dict(message)),
            now=now_ms,
            client=client,
        )
        return None if client is not None else int(res)

    def claim_label(self, label: str, session_key: str, *, client: Pipeline) -> None:
        """Queue on ``client``: a new session takes ``label`` in the label index unless
        another session holds it (its reply: 1 taken, 0 held); `label_taken` then writes
        it on the session (the index is in the home slot group, the session in its own)."""
        client.hsetnx(self.ks.labels, label, session_key)

    def label_taken(self, taken: Mapping[str, str]) -> None:
        """Write each label ``taken`` in the index on its session (session key → label)."""
        pipe = self.redis.pipeline(transaction=False)
        for session_key, label in taken.items():
            pipe.hset(self.ks.session(session_key), "label", label)
        pipe.execute()

    def add_lineage(
        self, requester: str, children: Mapping[str, float], *, client: Pipeline
    ) -> None:
        """Queue on ``client``: list ``children`` under the requester at their scores
        (their order among its children)."""
        client.zadd(self.ks.children(requester), dict(children))

    def announce_reads(
        self,
        spawn: SpawnRecord,
        *,
        check_requester: bool,
        read_requester: bool,
        run: RunRecord | None = None,
        child_session: Mapping[str, str] | None = None,
    ) -> AnnounceReads:
        """The child's run, the batch's join mode, the requester's lane holder and the
        child's session id, with (when asked) whether the requester's session exists and
        its entry: one pipelined round trip. ``run`` (the child's ended run) and
        ``child_session`` (its session hash), when the caller has them, are not read."""
        pipe = self.redis.pipeline(transaction=False)
        read = self.queue_announce_reads(
            pipe,
            spawn,
            check_requester=check_requester,
            read_requester=read_requester,
            run=run,
            child_session=child_session,
        )
        return read(pipe.execute())

    def queue_announce_reads(
        self,
        pipe: Pipeline,
        spawn: SpawnRecord,
        *,
        check_requester: bool,
        read_requester: bool,
        run: RunRecord | None = None,
        child_session: Mapping[str, str] | None = None,
    ) -> Callable[[Sequence[Any]], AnnounceReads]:
        """`announce_reads` queued on ``pipe`` (after what is queued there, before what
        comes next): answers the function that reads them from the pipeline's replies."""
        ks = self.ks
        requester, child = str(spawn["requesterKey"]), str(spawn["childKey"])
        run_id, batch_id = str(spawn.get("runId", "")), str(spawn.get("batchId") or "")
        at = len(pipe)
        if run is None:
            pipe.hgetall(ks.run(run_id))
        if batch_id:
            pipe.hget(ks.batch(batch_id), "join")
        pipe.get(ks.lane(requester))
        if child_session is None:
            pipe.hget(ks.session(child), "sessionId")
        if check_requester:
            pipe.exists(ks.session(requester))
        if read_requester:
            pipe.hgetall(ks.session(requester))

        def read(all_replies: Sequence[Any]) -> AnnounceReads:
            replies = iter(all_replies[at:])
            found = run
            if found is None:
                raw_run = next(replies)
                found = RunRecord.from_hash(run_id, codec.decode_hash(raw_run)) if raw_run else None
            join = as_text(next(replies)) if batch_id else ""
            holder = as_text(next(replies)) or None
            if child_session is None:
                session_id = as_text(next(replies)) or None
            else:
                session_id = child_session.get("sessionId") or None
            exists = bool(next(replies)) if check_requester else True
            raw_entry = next(replies) if read_requester else None
            entry = (
                SessionEntry.from_hash(requester, codec.decode_hash(raw_entry))
                if raw_entry
                else None
            )
            return AnnounceReads(found, join, holder, session_id, exists, entry)

        return read

    # -- active children --------------------------------------------------------------
    def reserve_children(
        self, requester: str, children: Sequence[str], limit: int
    ) -> tuple[bool, int]:
        """Add children to the requester's active set if the limit allows all of them."""
        res = self._lua["spawn_reserve"](
            children=self.ks.active_children(requester), limit=limit, members=children
        )
        return bool(int(res[0])), int(res[1])

    def release_child(self, requester: str, child: str, *, client: Pipeline | None = None) -> None:
        """The child finished announcing (or never started)."""
        self._on(client).srem(self.ks.active_children(requester), child)

    def active_children(self, requester: str) -> list[str]:
        """The requester's children whose spawn has not finished announcing."""
        return sorted(as_text(m) for m in self.redis.smembers(self.ks.active_children(requester)))

    # -- batches ----------------------------------------------------------------------
    def create_batch(self, batch_id: str, fields: Mapping[str, Any]) -> None:
        """Write a new batch hash."""
        self.redis.hset(self.ks.batch(batch_id), mapping=encode(fields))  # type: ignore[arg-type]

    def get_batch(self, batch_id: str) -> SpawnRecord | None:
        """A batch, or None."""
        raw = self.redis.hgetall(self.ks.batch(batch_id))
        return SpawnRecord.from_hash(batch_id, codec.decode_hash(raw)) if raw else None

    def batch_join(self, batch_id: str) -> str:
        """A batch's join mode ("" when the batch is unknown)."""
        return as_text(self.redis.hget(self.ks.batch(batch_id), "join"))

    def update_batch(
        self, batch_id: str, fields: Mapping[str, Any], *, client: Pipeline | None = None
    ) -> None:
        """Set fields of a batch."""
        self._on(client).hset(self.ks.batch(batch_id), mapping=encode(fields))  # type: ignore[arg-type]

    def delete_batch(self, batch_id: str) -> None:
        """Forget a batch that never started."""
        self.redis.delete(self.ks.batch(batch_id), self.ks.batch_done(batch_id))

    def count_done(self, batch_id: str, spawn_id: str, *, client: Pipeline | None = None) -> bool:
        """Count a finished member; True for the one member that must enqueue the join
        (on ``client``, the count is queued and its reply there is the answer)."""
        res = self._lua["spawn_count_done"](
            batch=self.ks.batch(batch_id),
            done=self.ks.batch_done(batch_id),
            spawn_id=spawn_id,
            client=client,
        )
        return client is None and bool(int(res))

    def done_count(self, batch_id: str) -> int:
        """How many members have finished."""
        return int(self.redis.scard(self.ks.batch_done(batch_id)))

    def expire_batch(self, batch_id: str, *, client: Pipeline | None = None) -> None:
        """Keep a finished batch for ``runs.retentionHours``."""
        pipe = self.redis.pipeline(transaction=False) if client is None else client
        pipe.expire(self.ks.batch(batch_id), self.retention_s)
        pipe.expire(self.ks.batch_done(batch_id), self.retention_s)
        if client is None:
            pipe.execute()

    # -- archival ---------------------------------------------------------------------
    def schedule_archive(
        self, session_key: str, at_ms: int, *, client: Pipeline | None = None
    ) -> None:
        """Archive a sub-agent session at ``at_ms`` (an earlier schedule is kept)."""
        self._on(client).zadd(
            self.ks.beside(session_key).archive_due, {session_key: at_ms}, nx=True
        )

    def archive_at(self, session_key: str) -> int | None:
        """When a session is due for archival, if scheduled."""
        score = self.redis.zscore(self.ks.beside(session_key).archive_due, session_key)
        return None if score is None else int(score)

    def due_archives(self, now_ms: int, limit: int = 200) -> list[str]:
        """Sessions whose archival time has come (at most ``limit`` per slot group)."""
        indexes = (group.archive_due for group in self.ks.every_group())
        return members_due(self.redis, indexes, before_ms=now_ms, limit=limit)

    def take_due_archives(self, now_ms: int, recheck_ms: int, limit: int = 200) -> list[str]:
        """The sessions whose archival time has come, each pushed ``recheck_ms`` on in the
        same step: of two sweeps running at once (two beats, or a worker's startup sweep
        beside beat's), one takes a session; it comes back if that sweep dies."""
        indexes = (group.archive_due for group in self.ks.every_group())
        return take_due(
            self.redis, self._lua, indexes, now_ms=now_ms, recheck_ms=recheck_ms, limit=limit
        )

    def postpone_archive(self, session_key: str, at_ms: int) -> None:
        """Look at a due session again later (it is busy)."""
        self.redis.zadd(self.ks.beside(session_key).archive_due, {session_key: at_ms}, xx=True)

    def unschedule_archive(self, session_key: str) -> None:
        """Drop a session from the archive queue."""
        self.redis.zrem(self.ks.beside(session_key).archive_due, session_key)
