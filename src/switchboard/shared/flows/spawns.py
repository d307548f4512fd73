"""Spawn and batch records in Redis: the state of sub-agent flows between their steps.

A spawn hash holds one child (who asked, what, how to clean up, the run, the frozen
outcome, the announce state); a batch hash groups the spawns of one fan-out. Every
read-decide-write step is one Lua script, so a step that runs twice (late ack, a retried
task, two sweeps) changes nothing the second time:

- ``reserve_children``: the active-children limit is checked and taken in one step;
- ``freeze``: the child's outcome is recorded once, the first writer wins;
- ``append_once``: the announce lands in the requester's transcript exactly once (the
  message and the state change are one step);
- ``count_done``: a batch member counts itself; once all have, exactly one member (the
  same one on a retry) wins the join.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.commands.core import Script

from switchboard.shared.services import Services
from switchboard.shared.store import codec
from switchboard.shared.store.scripts import as_text

_RESERVE = """
local n = redis.call('SCARD', KEYS[1])
local new = 0
for i = 2, #ARGV do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 0 then new = new + 1 end
end
if n + new > tonumber(ARGV[1]) then return {0, n} end
for i = 2, #ARGV do redis.call('SADD', KEYS[1], ARGV[i]) end
return {1, n}
"""

_FREEZE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
for k, v in pairs(cjson.decode(ARGV[2])) do redis.call('HSET', KEYS[1], k, v) end
return 1
"""

_CAS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if (redis.call('HGET', KEYS[1], ARGV[1]) or '') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""

_APPEND_ONCE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if (redis.call('HGET', KEYS[1], ARGV[1]) or '') ~= ARGV[2] then return 0 end
local seq = redis.call('HINCRBY', KEYS[2], 'seq', 1)
redis.call('XADD', KEYS[3], seq .. '-0', 'm', ARGV[4])
redis.call('HSET', KEYS[2], 'updatedAt', ARGV[5])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return seq
"""

# A new child session takes its label unless another session holds it (labels are unique).
# KEYS: label index, session. ARGV: label, session key
_CLAIM_LABEL = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[2], 'label', ARGV[1])
return 1
"""

# Move a field of an existing hash from one value to another (one caller wins), counting
# the move in the metrics hash.
# KEYS: hash, metrics. ARGV: field, expected, new, metric field
_SETTLE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if (redis.call('HGET', KEYS[1], ARGV[1]) or '') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[2], ARGV[4], 1)
return 1
"""

_COUNT_DONE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SADD', KEYS[2], ARGV[1])
local expected = tonumber(redis.call('HGET', KEYS[1], 'expected') or '0')
if redis.call('SCARD', KEYS[2]) < expected then return 0 end
redis.call('HSETNX', KEYS[1], 'joiner', ARGV[1])
if redis.call('HGET', KEYS[1], 'joiner') == ARGV[1] then return 1 end
return 0
"""


@dataclass(frozen=True)
class _Scripts:
    reserve: Script
    freeze: Script
    cas: Script
    append_once: Script
    count_done: Script
    claim_label: Script
    settle: Script


@lru_cache(maxsize=16)
def _scripts(redis: Redis) -> _Scripts:
    return _Scripts(
        reserve=redis.register_script(_RESERVE),
        freeze=redis.register_script(_FREEZE),
        cas=redis.register_script(_CAS),
        append_once=redis.register_script(_APPEND_ONCE),
        count_done=redis.register_script(_COUNT_DONE),
        claim_label=redis.register_script(_CLAIM_LABEL),
        settle=redis.register_script(_SETTLE),
    )


_INT_FIELDS = frozenset(
    {"createdAt", "endedAt", "startedAt", "batchIndex", "runTimeoutSeconds", "depth"}
)
_JSON_FIELDS = frozenset({"requesterOrigin", "usage", "spawnIds"})


@dataclass(frozen=True)
class Record:
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
    def from_hash(cls, record_id: str, raw: Mapping[str, str]) -> Record:
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

    def with_fields(self, fields: Mapping[str, Any]) -> Record:
        """The record after ``fields`` were written to its hash (as read back)."""
        return Record.from_hash(self.id, {**_encode(self.fields), **_encode(fields)})


def _encode(fields: Mapping[str, Any]) -> dict[str, str]:
    return {k: e for k, v in fields.items() if (e := codec.encode_value(v)) is not None}


class SpawnRecords:
    """Spawn hashes, batch hashes, active-children sets and the archive queue."""

    def __init__(self, svc: Services) -> None:
        self.redis: Redis = svc.store.redis
        self.ks = svc.store.ks
        self.retention_s = svc.store.runs.retention_s
        self.scripts = _scripts(self.redis)

    # -- spawns -----------------------------------------------------------------------
    def create(
        self, spawn_id: str, fields: Mapping[str, Any], *, client: Pipeline | None = None
    ) -> None:
        """Write a new spawn hash (queued on ``client`` when given)."""
        target = self.redis if client is None else client
        target.hset(self.ks.spawn(spawn_id), mapping=_encode(fields))  # type: ignore[arg-type]

    def get(self, spawn_id: str) -> Record | None:
        """A spawn, or None when unknown or expired."""
        raw = self.redis.hgetall(self.ks.spawn(spawn_id))
        return Record.from_hash(spawn_id, codec.decode_hash(raw)) if raw else None

    def get_many(self, spawn_ids: Sequence[str]) -> list[Record | None]:
        """Several spawns in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for sid in spawn_ids:
            pipe.hgetall(self.ks.spawn(sid))
        return [
            Record.from_hash(sid, codec.decode_hash(raw)) if raw else None
            for sid, raw in zip(spawn_ids, pipe.execute(), strict=True)
        ]

    def update(
        self, spawn_id: str, fields: Mapping[str, Any], *, client: Pipeline | None = None
    ) -> None:
        """Set fields of a spawn (queued on ``client`` when given)."""
        target = self.redis if client is None else client
        target.hset(self.ks.spawn(spawn_id), mapping=_encode(fields))  # type: ignore[arg-type]

    def delete(self, spawn_id: str) -> None:
        """Forget a spawn that never started."""
        self.redis.delete(self.ks.spawn(spawn_id))

    def expire(self, spawn_id: str, *, client: Pipeline | None = None) -> None:
        """Keep a finished spawn for ``runs.retentionHours``."""
        (self.redis if client is None else client).expire(self.ks.spawn(spawn_id), self.retention_s)

    def freeze(self, spawn_id: str, fields: Mapping[str, Any], guard: str = "outcome") -> bool:
        """Record the outcome once; False when it was already recorded."""
        args = [guard, codec.dumps(_encode(fields))]
        return bool(int(self.scripts.freeze(keys=[self.ks.spawn(spawn_id)], args=args)))

    def cas(self, hash_key: str, field: str, expected: str, new: str) -> bool:
        """Move ``field`` of an existing hash from ``expected`` to ``new`` (one caller wins)."""
        return bool(int(self.scripts.cas(keys=[hash_key], args=[field, expected, new])))

    def settle(
        self,
        hash_key: str,
        field: str,
        expected: str,
        new: str,
        *,
        metric: str,
        client: Pipeline | None = None,
    ) -> None:
        """``cas``, adding one to the ``metric`` counter when it moves (queued on
        ``client`` when given)."""
        self.scripts.settle(
            keys=[hash_key, self.ks.metrics], args=[field, expected, new, metric], client=client
        )

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
        res = self.scripts.append_once(
            keys=[hash_key, self.ks.session(session_key), self.ks.transcript(session_key)],
            args=[field, expected, new, codec.dumps(dict(message)), now_ms],
            client=client,
        )
        return None if client is not None else int(res)

    def claim_label(self, label: str, session_key: str, *, client: Pipeline) -> None:
        """Queue on ``client``: a new session takes ``label`` unless another holds it."""
        self.scripts.claim_label(
            keys=[self.ks.labels, self.ks.session(session_key)],
            args=[label, session_key],
            client=client,
        )

    # -- active children --------------------------------------------------------------
    def reserve_children(
        self, requester: str, children: Sequence[str], limit: int
    ) -> tuple[bool, int]:
        """Add children to the requester's active set if the limit allows all of them."""
        res = self.scripts.reserve(
            keys=[self.ks.active_children(requester)], args=[limit, *children]
        )
        return bool(int(res[0])), int(res[1])

    def release_child(self, requester: str, child: str, *, client: Pipeline | None = None) -> None:
        """The child finished announcing (or never started)."""
        (self.redis if client is None else client).srem(self.ks.active_children(requester), child)

    def active_children(self, requester: str) -> list[str]:
        """The requester's children whose spawn has not finished announcing."""
        return sorted(as_text(m) for m in self.redis.smembers(self.ks.active_children(requester)))

    # -- batches ----------------------------------------------------------------------
    def create_batch(self, batch_id: str, fields: Mapping[str, Any]) -> None:
        """Write a new batch hash."""
        self.redis.hset(self.ks.batch(batch_id), mapping=_encode(fields))  # type: ignore[arg-type]

    def get_batch(self, batch_id: str) -> Record | None:
        """A batch, or None."""
        raw = self.redis.hgetall(self.ks.batch(batch_id))
        return Record.from_hash(batch_id, codec.decode_hash(raw)) if raw else None

    def batch_join(self, batch_id: str) -> str:
        """A batch's join mode ("" when the batch is unknown)."""
        return as_text(self.redis.hget(self.ks.batch(batch_id), "join"))

    def update_batch(
        self, batch_id: str, fields: Mapping[str, Any], *, client: Pipeline | None = None
    ) -> None:
        """Set fields of a batch."""
        target = self.redis if client is None else client
        target.hset(self.ks.batch(batch_id), mapping=_encode(fields))  # type: ignore[arg-type]

    def delete_batch(self, batch_id: str) -> None:
        """Forget a batch that never started."""
        self.redis.delete(self.ks.batch(batch_id), self.ks.batch_done(batch_id))

    def count_done(self, batch_id: str, spawn_id: str, *, client: Pipeline | None = None) -> bool:
        """Count a finished member; True for the one member that must enqueue the join
        (on ``client``, the count is queued and the answer is its reply)."""
        keys = [self.ks.batch(batch_id), self.ks.batch_done(batch_id)]
        res = self.scripts.count_done(keys=keys, args=[spawn_id], client=client)
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
        target = self.redis if client is None else client
        target.zadd(self.ks.archive_due, {session_key: at_ms}, nx=True)

    def archive_at(self, session_key: str) -> int | None:
        """When a session is due for archival, if scheduled."""
        score = self.redis.zscore(self.ks.archive_due, session_key)
        return None if score is None else int(score)

    def due_archives(self, now_ms: int, limit: int = 200) -> list[str]:
        """Sessions whose archival time has come."""
        rows = self.redis.zrangebyscore(self.ks.archive_due, "-inf", now_ms, start=0, num=limit)
        return [as_text(r) for r in rows]

    def postpone_archive(self, session_key: str, at_ms: int) -> None:
        """Look at a due session again later (it is busy)."""
        self.redis.zadd(self.ks.archive_due, {session_key: at_ms}, xx=True)

    def unschedule_archive(self, session_key: str) -> None:
        """Drop a session from the archive queue."""
        self.redis.zrem(self.ks.archive_due, session_key)
