"""Delivery records in Redis: create once per idempotency key, claim an attempt, settle it.

A delivery is a hash (``Keyspace.delivery``) indexed per session
(``Keyspace.session_deliveries``). Its life: ``pending`` → ``sending`` (one attempt holds a
lease) → ``delivered`` | ``failed`` | ``denied``, or back to ``pending`` with a later
``nextAttemptAt`` for a retry. Every transition is one Lua script guarded by the status and
the attempt number, so a duplicated or redelivered step can never send twice in parallel
nor overwrite a newer outcome.

Until it settles, a delivery is also in the due index (``Keyspace.deliveries_due``),
scored by when its step must run again if nothing else runs it: the retry time, the end of
the sending attempt's lease, or (for a step just enqueued) the time after which that step
is presumed lost with its worker. The sweep enqueues what is due (``due``, ``postpone``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from switchboard.shared import metrics
from switchboard.shared.delivery import adapters
from switchboard.shared.policy.send_policy import SEND_BLOCKED
from switchboard.shared.services import Services
from switchboard.shared.store import codec
from switchboard.shared.store.keyspace import EVENTS_MAXLEN
from switchboard.shared.store.runs import now_ms
from switchboard.shared.store.scripts import LUA_SET_FIELDS, as_text

TERMINAL_STATUSES = frozenset({"delivered", "failed", "denied"})
# Delivery ids are derived from the idempotency key, so the same key is the same delivery.
_ID_NAMESPACE = uuid.UUID("5b0c6f1e-3c1d-4d7e-9f5a-2f1e8f7c9a41")
# A step that wakes up this much before its retry is due still runs (clock jitter).
_DUE_SLACK_MS = 250
_INT_FIELDS = frozenset(
    {"attempts", "createdAt", "updatedAt", "nextAttemptAt", "deliveredAt", "leaseUntil"}
)


# Create a delivery unless its id exists, index it for its session and in the due index.
# KEYS: delivery, session index, due index.
# ARGV: JSON fields, id, now ms, index TTL s, prune before ms, presumed-lost time ms
_CREATE = (
    LUA_SET_FIELDS
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
set_fields(KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[2])
return 1
"""
)

# Create a delivery to a channel served inside the product and settle it in the same
# step: the send is a store write (a ``delivery`` event for webchat), so there is nothing
# to retry and nothing to leave in the due index. The send policy is ARGV[6] when decided
# by the caller, else ('') the session's own override (``sendPolicy``), read here.
# KEYS: delivery, session index, events stream, metrics hash, session.
# ARGV: JSON fields, id, now ms, index TTL s, prune before ms, policy, webchat event JSON
#       ('' = none), events maxlen, settled event JSON if delivered, if denied,
#       delivered metric field, denied metric field, denied error.
# Returns 0 when the delivery exists, 1 when delivered, 2 when denied.
_CREATE_LOCAL = (
    LUA_SET_FIELDS
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local policy = ARGV[6]
if policy == '' then
  policy = 'allow'
  local override = redis.call('HGET', KEYS[5], 'sendPolicy')
  if override and string.lower(string.match(override, '^%s*(.-)%s*$')) == 'deny' then
    policy = 'deny'
  end
end
set_fields(KEYS[1], ARGV[1])
local outcome = 1
if policy == 'deny' then
  outcome = 2
  redis.call('HSET', KEYS[1], 'status', 'denied', 'lastError', ARGV[13], 'attempts', 1)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'type', 'delivery.settled',
    'data', ARGV[10])
  redis.call('HINCRBY', KEYS[4], ARGV[12], 1)
else
  if ARGV[7] ~= '' then
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'type', 'delivery', 'data', ARGV[7])
  end
  redis.call('HSET', KEYS[1], 'status', 'delivered', 'deliveredAt', ARGV[3], 'attempts', 1)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'type', 'delivery.settled',
    'data', ARGV[9])
  redis.call('HINCRBY', KEYS[4], ARGV[11], 1)
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return outcome
"""
)

# Start an attempt: only a pending delivery that is due, or one whose sender lost its lease.
# The due index then points at the lease's end (the sender is presumed dead after it).
# KEYS: delivery, due index. ARGV: now ms, lease expiry ms, due slack ms, id
# Returns {verdict, value}: ok/attempt, early/due ms, busy, done/status, missing.
_CLAIM = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then
  redis.call('ZREM', KEYS[2], ARGV[4])
  return {'missing', ''}
end
local now = tonumber(ARGV[1])
if st == 'pending' then
  local due = tonumber(redis.call('HGET', KEYS[1], 'nextAttemptAt') or '0')
  if due > now + tonumber(ARGV[3]) then
    redis.call('ZADD', KEYS[2], 'LT', due, ARGV[4])
    return {'early', tostring(due)}
  end
elseif st == 'sending' then
  local lease = tonumber(redis.call('HGET', KEYS[1], 'leaseUntil') or '0')
  if lease > now then return {'busy', ''} end
else
  redis.call('ZREM', KEYS[2], ARGV[4])
  return {'done', st}
end
local n = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSET', KEYS[1], 'status', 'sending', 'leaseUntil', ARGV[2], 'updatedAt', ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[4])
return {'ok', tostring(n)}
"""

# Settle the attempt that holds the delivery (status sending, same attempt number): a
# final outcome leaves the due index, a retry is due at its ``nextAttemptAt``.
# KEYS: delivery, due index. ARGV: attempt, JSON fields, TTL s (0 = keep), id, due ms ('' = final)
_SETTLE = (
    LUA_SET_FIELDS
    + """
if redis.call('HGET', KEYS[1], 'status') ~= 'sending' then return 0 end
if redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[1] then return 0 end
set_fields(KEYS[1], ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[3]) end
if ARGV[5] == '' then
  redis.call('ZREM', KEYS[2], ARGV[4])
else
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
end
return 1
"""
)

# Take the due deliveries and push each one's next look ``ARGV[3]`` ms on (one sweep wins).
# KEYS: due index. ARGV: now ms, limit, recheck ms
_TAKE_DUE = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local later = tonumber(ARGV[1]) + tonumber(ARGV[3])
for _, id in ipairs(ids) do redis.call('ZADD', KEYS[1], later, id) end
return ids
"""


@dataclass(frozen=True)
class Target:
    """Where a message goes: a channel and, for chat platforms, the chat within it."""

    channel: str
    to: str | None = None
    account_id: str | None = None
    thread_id: str | None = None


@dataclass(frozen=True)
class Outgoing:
    """A message to deliver: where, what, for which session, under which idempotency key."""

    target: Target
    message: str
    session_key: str
    idempotency_key: str
    origin: Mapping[str, str]

    @property
    def delivery_id(self) -> str:
        """The delivery's id (derived from the idempotency key)."""
        return delivery_id_for(self.idempotency_key)

    def new_fields(self, now: int) -> dict[str, Any]:
        """The hash of a new, pending delivery."""
        target = self.target
        return {
            "deliveryId": self.delivery_id,
            "channel": target.channel,
            "to": target.to,
            "accountId": target.account_id,
            "threadId": target.thread_id,
            "message": self.message,
            "sessionKey": self.session_key,
            "idempotencyKey": self.idempotency_key,
            "origin": dict(self.origin),
            "status": "pending",
            "attempts": 0,
            "createdAt": now,
            "updatedAt": now,
        }


@dataclass(frozen=True)
class Claim:
    """The answer to "may this step send now?": ``ok`` with the attempt number, or why not."""

    verdict: str
    attempt: int = 0
    due_ms: int = 0


def delivery_id_for(idempotency_key: str) -> str:
    """The delivery id of an idempotency key (deterministic)."""
    return str(uuid.uuid5(_ID_NAMESPACE, idempotency_key))


def retention_s(svc: Services) -> int:
    """How long settled deliveries (and session indexes) are kept: the run retention."""
    return max(60, int(svc.config.runs.retention_hours * 3600))


def create(svc: Services, out: Outgoing) -> tuple[str, bool]:
    """Record a pending delivery; returns (id, created) — False when it already existed."""
    now = now_ms()
    ks = svc.store.ks
    created = svc.store.redis.register_script(_CREATE)(
        keys=[
            ks.delivery(out.delivery_id),
            ks.session_deliveries(out.session_key),
            ks.deliveries_due,
        ],
        args=[*_record_args(svc, out.new_fields(now), now), now + lost_after_ms(svc)],
    )
    return out.delivery_id, bool(int(created))


def create_local(svc: Services, out: Outgoing, *, policy: str | None) -> tuple[str, str | None]:
    """Record and settle a delivery to a channel served inside the product, in one step.

    ``policy`` is the send policy's decision (``allow``/``deny``), or None to go by the
    session's own override alone (no send-policy rules are configured). Returns (id,
    outcome): ``delivered`` or ``denied``, None when the delivery already existed."""
    now = now_ms()
    ks = svc.store.ks
    fields = out.new_fields(now)
    webchat = adapters.webchat_event(fields, now) if out.target.channel == "webchat" else None
    res = svc.store.redis.register_script(_CREATE_LOCAL)(
        keys=[
            ks.delivery(out.delivery_id),
            ks.session_deliveries(out.session_key),
            ks.events,
            ks.metrics,
            ks.session(out.session_key),
        ],
        args=[
            *_record_args(svc, fields, now),
            policy or "",
            codec.dumps(webchat) if webchat else "",
            EVENTS_MAXLEN,
            codec.dumps({**adapters.settled_event(fields, 1, "delivered", None), "ts": now}),
            codec.dumps({**adapters.settled_event(fields, 1, "denied", SEND_BLOCKED), "ts": now}),
            metrics.field_name(metrics.DELIVERIES, "delivered"),
            metrics.field_name(metrics.DELIVERIES, "denied"),
            SEND_BLOCKED,
        ],
    )
    return out.delivery_id, {1: "delivered", 2: "denied"}.get(int(res))


def _record_args(svc: Services, fields: Mapping[str, Any], now: int) -> list[Any]:
    """The arguments both create scripts start with: fields, id, now, retention, prune."""
    keep_s = retention_s(svc)
    return [codec.fields_json(fields), fields["deliveryId"], now, keep_s, now - keep_s * 1000]


def lost_after_ms(svc: Services) -> int:
    """How long an enqueued or sending step may take before it is presumed lost with its
    worker: the adapter's timeout plus the lane lease (``SWITCHBOARD_LANE_LEASE_S``)."""
    return int((svc.config.delivery.timeout_s + svc.settings.lane_lease_s) * 1000)


def claim(svc: Services, delivery_id: str, lease_ms: int) -> Claim:
    """Take the delivery for one attempt (see ``_CLAIM`` for the rules)."""
    now = now_ms()
    ks = svc.store.ks
    res = svc.store.redis.register_script(_CLAIM)(
        keys=[ks.delivery(delivery_id), ks.deliveries_due],
        args=[now, now + lease_ms, _DUE_SLACK_MS, delivery_id],
    )
    verdict, value = as_text(res[0]), as_text(res[1])
    if verdict == "ok":
        return Claim("ok", attempt=int(value))
    if verdict == "early":
        return Claim("early", due_ms=int(value))
    return Claim(verdict)


def settle(
    svc: Services, delivery_id: str, attempt: int, fields: Mapping[str, Any], *, final: bool
) -> bool:
    """Write the outcome of ``attempt``; a final outcome starts the retention clock and
    leaves the due index, a retry is due at ``fields["nextAttemptAt"]``."""
    ks = svc.store.ks
    due = "" if final else str(int(fields["nextAttemptAt"]))
    res = svc.store.redis.register_script(_SETTLE)(
        keys=[ks.delivery(delivery_id), ks.deliveries_due],
        args=[
            attempt,
            codec.fields_json({**fields, "updatedAt": now_ms()}),
            _ttl(svc, final),
            delivery_id,
            due,
        ],
    )
    return bool(int(res))


def take_due(svc: Services, now: int, recheck_ms: int, limit: int = 500) -> list[str]:
    """The deliveries whose step is due, each pushed ``recheck_ms`` on (a later sweep
    enqueues it again if that step is lost too; settling removes it)."""
    res = svc.store.redis.register_script(_TAKE_DUE)(
        keys=[svc.store.ks.deliveries_due], args=[now, limit, recheck_ms]
    )
    return [as_text(v) for v in res]


def _ttl(svc: Services, final: bool) -> int:
    return retention_s(svc) if final else 0


def get(svc: Services, delivery_id: str) -> dict[str, Any] | None:
    """The delivery as a JSON-ready dict, or None when unknown or expired."""
    raw = svc.store.redis.hgetall(svc.store.ks.delivery(delivery_id))
    return _decode(codec.decode_hash(raw)) if raw else None


def for_session(svc: Services, session_key: str, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` deliveries of a session, newest first (expired ones skipped)."""
    ks = svc.store.ks
    rows = svc.store.redis.zrevrange(ks.session_deliveries(session_key), 0, limit - 1)
    ids = [as_text(v) for v in rows]
    pipe = svc.store.redis.pipeline(transaction=False)
    for delivery_id in ids:
        pipe.hgetall(ks.delivery(delivery_id))
    return [_decode(codec.decode_hash(raw)) for raw in pipe.execute() if raw]


def _decode(h: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in h.items():
        if name in _INT_FIELDS:
            out[name] = codec.as_int(value)
        elif name == "origin":
            out[name] = codec.as_json(value, {})
        elif name != "leaseUntil":
            out[name] = value
    return out
