"""Collector children (`sessions_spawn` with `collect: true`) and the waits on them.

A collector record (``Keyspace.collector``, one hash per child run id) is written with
the child's spawn, before its run is queued; when the child ends, its completion is
written once (``complete``), in the same step as its entry in the requester's completion
log (a stream: the entry ids give the completion order) and its group's freed slot.
``agents_wait`` reads up to 1,000 records in one step (``read``), and when none has
completed registers a *wait token* on the pending ones in that same step: a run-shaped
hash (``Keyspace.run`` of ``wait:<uuid>``) that a completion fires (``fire``) as a run's
end is finished, so a parked agent run and the api's run waiter wait on it exactly as
they wait on a run.

Methods taking ``client`` queue their command on that pipeline (`Store.pipeline`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.client import Pipeline

from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts
from switchboard.shared.store.run_records import now_ms

# The completion log of one requester is capped near this many entries (XADD MAXLEN ~).
LOG_MAXLEN = 100_000
# A pending collector record outlives the longest run (an hour) by this much.
_PENDING_EXTRA_S = 2 * 3600
# Prefix of wait-token ids (their hashes live beside the runs': `sb:r:wait:<uuid>`).
TOKEN_PREFIX = "wait:"
_JSON_FIELDS = frozenset({"outputSchema", "structured", "usage"})

# `read` answers, per id: one of these, or the completed record's fields.
NOT_FOUND, NOT_OWNER, PENDING = "not_found", "not_owner", "pending"
_CODES = {"n": NOT_FOUND, "o": NOT_OWNER, "p": PENDING}


@dataclass(frozen=True)
class WaitRead:
    """What ``read`` found: each id's state (a code, or its completed record's fields) and
    the token registered on the pending ones (None when none was)."""

    found: dict[str, str | dict[str, Any]]
    token: str | None


def decode(raw: Mapping[str, str]) -> dict[str, Any]:
    """A collector hash with its JSON fields decoded (wait-token fields left out)."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name.startswith("w:"):
            continue
        out[name] = codec.as_json(value) if name in _JSON_FIELDS else value
    return out


class CollectStore:
    """Collector records, completion logs, group caps and wait tokens."""

    def __init__(self, redis: Redis, ks: Keyspace, *, retention_s: int) -> None:
        self.redis = redis
        self.ks = ks
        self.retention_s = retention_s
        self._lua = LuaScripts(redis)

    def _on(self, client: Pipeline | None) -> Redis | Pipeline:
        return self.redis if client is None else client

    # -- records ----------------------------------------------------------------------
    def create(
        self, run_id: str, fields: Mapping[str, Any], *, client: Pipeline | None = None
    ) -> None:
        """Write a new collector record (queued on ``client`` when given)."""
        key = self.ks.collector(run_id)
        mapping = {k: e for k, v in fields.items() if (e := codec.encode_value(v)) is not None}
        on = self._on(client)
        on.hset(key, mapping=mapping)  # type: ignore[arg-type]
        on.expire(key, self.retention_s + _PENDING_EXTRA_S)

    def get(self, run_id: str) -> dict[str, Any] | None:
        """A collector record, or None when unknown or expired."""
        raw = self.redis.hgetall(self.ks.collector(run_id))
        return decode(codec.decode_hash(raw)) if raw else None

    def complete(
        self, run_id: str, requester: str, group_id: str, fields: Mapping[str, Any]
    ) -> tuple[str, list[str]]:
        """Record a completion once: ('ok' | 'again' | 'missing', tokens to fire).

        ``structured`` (any JSON value, null included) is kept as JSON when present."""
        encoded = {k: e for k, v in fields.items() if (e := codec.encode_value(v)) is not None}
        if "structured" in fields:
            encoded["structured"] = codec.dumps(fields["structured"])
        res = self._lua["collect_complete"](
            record=self.ks.collector(run_id),
            log=self.ks.collect_log(requester),
            group=self.ks.collect_group(requester, group_id),
            run_id=run_id,
            now=now_ms(),
            fields=codec.dumps(encoded),
            retention_s=self.retention_s,
            log_cap=LOG_MAXLEN,
        )
        return as_text(res[0]), [as_text(t) for t in res[1:]]

    def log(self, requester: str, count: int = 1000) -> list[str]:
        """The run ids of a requester's completion log, oldest first."""
        rows: Any = self.redis.xrange(self.ks.collect_log(requester), count=count)
        return [codec.decode_hash(fields).get("runId", "") for _, fields in rows or []]

    # -- groups -----------------------------------------------------------------------
    def reserve_group(
        self, requester: str, group_id: str, n: int, *, max_active: int, max_total: int
    ) -> tuple[str, int, int]:
        """Take ``n`` slots of a group: ('ok' | the refusing cap, active, total) as they
        were before."""
        res = self._lua["collect_reserve"](
            group=self.ks.collect_group(requester, group_id),
            n=n,
            max_active=max_active,
            max_total=max_total,
            ttl_s=self.retention_s + _PENDING_EXTRA_S,
        )
        return as_text(res[0]), int(res[1]), int(res[2])

    def release_group(self, requester: str, group_id: str, n: int) -> None:
        """Give back slots taken for children that were never started."""
        key = self.ks.collect_group(requester, group_id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hincrby(key, "active", -n)
        pipe.hincrby(key, "total", -n)
        pipe.execute()

    # -- waits ------------------------------------------------------------------------
    def read(self, requester: str, run_ids: Sequence[str], *, mode: str, ttl_s: int) -> WaitRead:
        """The state of ``run_ids`` for ``requester``, in one step. ``mode`` 'any': with
        nothing completed, a new wait token on the pending ones that the first completion
        fires; 'all': a token the last pending one's completion fires; 'none': no token.
        A token is kept ``ttl_s``.

        A requester's collector children are in its slot group (their runs' ids are made
        there), so an id of another group is never its child: it is answered unknown or
        another requester's, without the step."""
        group = self.ks.group_of_key(requester)
        own = [r for r in run_ids if self.ks.group_of_id(r) == group]
        token = TOKEN_PREFIX + self.ks.new_id(group)
        res = self._lua["collect_wait"](
            token=self.ks.run(token),
            records=[self.ks.collector(r) for r in own],
            requester=requester,
            token_id=token,
            now=now_ms(),
            ttl_s=ttl_s,
            mode=mode,
        )
        found: dict[str, str | dict[str, Any]] = self._foreign(
            [r for r in run_ids if self.ks.group_of_id(r) != group]
        )
        for run_id, item in zip(own, res[1:], strict=True):
            if isinstance(item, list):
                found[run_id] = decode(codec.decode_flat_hash(item))
            else:
                found[run_id] = _CODES[as_text(item)]
        return WaitRead(found={r: found[r] for r in run_ids}, token=token if int(res[0]) else None)

    def _foreign(self, run_ids: Sequence[str]) -> dict[str, str | dict[str, Any]]:
        """Ids of another slot group than the requester's: unknown, or another's child."""
        if not run_ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hexists(self.ks.collector(run_id), "requesterKey")
        held = pipe.execute()
        return {r: NOT_OWNER if h else NOT_FOUND for r, h in zip(run_ids, held, strict=True)}

    def fire(self, tokens: Sequence[str], run_id: str) -> list[str]:
        """Count ``run_id``'s completion on these wait tokens; those it ends (as runs end)
        answer the parked runs waiting on them."""
        if not tokens:
            return []
        keys: list[str] = []
        for token in tokens:
            keys += [self.ks.run(token), self.ks.run_waiters(token)]
        res = self._lua["collect_fire"](
            tokens=keys,
            channel=self.ks.run_events,
            now=now_ms(),
            retention_s=600,
            run_id=run_id,
            token_ids=list(tokens),
        )
        return [as_text(w) for w in res]

    def drop_token(self, token: str) -> None:
        """Forget a wait token once its wait has answered."""
        self.redis.delete(self.ks.run(token), self.ks.run_waiters(token))
