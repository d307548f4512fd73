"""Delivery records: create once, claim an attempt, settle it, find what is due.

A delivery is a hash (``Keyspace.delivery``) indexed per session
(``Keyspace.session_deliveries``) and, until it settles, in the due index
(``Keyspace.deliveries_due``) scored by when its step must run again if nothing else runs
it. Every transition is one script (``lua/delivery_*.lua``) guarded by the status and the
attempt number; what a delivery holds and when it is due is decided by
``shared.delivery``, which calls this store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.client import Pipeline

from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.due_index import take_due
from switchboard.shared.store.keyspace import EVENTS_MAXLEN, Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts

_INT_FIELDS = frozenset(
    {"attempts", "createdAt", "updatedAt", "nextAttemptAt", "deliveredAt", "leaseUntil"}
)


@dataclass(frozen=True)
class NewDelivery:
    """A delivery to record: its hash and where it is indexed."""

    delivery_id: str
    session_key: str
    fields: Mapping[str, Any]
    now_ms: int
    # How long the settled hash and the session's index are kept.
    keep_s: int


@dataclass(frozen=True)
class LocalOutcome:
    """How a delivery served inside the product settles at once (`create_local`)."""

    # allow | deny, or '' to go by the session's own ``sendPolicy`` override.
    policy: str
    # The ``delivery`` event's data for a webchat message (None: no event).
    webchat_event: Mapping[str, Any] | None
    # The ``delivery.settled`` event's data for each outcome.
    delivered_event: Mapping[str, Any]
    denied_event: Mapping[str, Any]
    # The delivery's lastError when denied.
    denied_error: str


@dataclass(frozen=True)
class Claim:
    """The answer to "may this step send now?": ``ok`` with the attempt number, ``early``
    with when it is due, or ``busy`` | ``done`` | ``missing``."""

    verdict: str
    attempt: int = 0
    due_ms: int = 0


class DeliveryStore:
    """Delivery hashes, their per-session indexes and the due index."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._lua = LuaScripts(redis)

    def create(self, new: NewDelivery, *, lost_at_ms: int) -> bool:
        """Record a pending delivery, due at ``lost_at_ms`` unless its step claims it;
        False when it already existed."""
        res = self._lua["delivery_create"](
            delivery=self.ks.delivery(new.delivery_id),
            session_index=self.ks.session_deliveries(new.session_key),
            due=self.ks.beside(new.session_key).deliveries_due,
            lost_at=lost_at_ms,
            **self._record_args(new),
        )
        return bool(int(res))

    def create_local(
        self, new: NewDelivery, outcome: LocalOutcome, *, client: Pipeline | None = None
    ) -> str | None:
        """Record and settle a delivery in one step: ``delivered`` or ``denied``, None
        when it already existed (see delivery_create_local.lua). Queued on ``client`` when
        given (answer None; decode its reply with `local_outcome`)."""
        webchat = outcome.webchat_event
        res = self._lua["delivery_create_local"](
            delivery=self.ks.delivery(new.delivery_id),
            session_index=self.ks.session_deliveries(new.session_key),
            events=self.ks.beside(new.session_key).events,
            session=self.ks.session(new.session_key),
            policy=outcome.policy,
            webchat_event=codec.dumps(dict(webchat)) if webchat else "",
            events_maxlen=EVENTS_MAXLEN,
            delivered_event=codec.dumps(dict(outcome.delivered_event)),
            denied_event=codec.dumps(dict(outcome.denied_event)),
            denied_error=outcome.denied_error,
            **self._record_args(new),
            client=client,
        )
        return None if client is not None else self.local_outcome(res)

    @staticmethod
    def local_outcome(reply: Any) -> str | None:
        """Decode `create_local`'s reply."""
        return {1: "delivered", 2: "denied"}.get(int(reply))

    @staticmethod
    def _record_args(new: NewDelivery) -> dict[str, Any]:
        """The arguments both create scripts take: fields, id, now, retention, prune."""
        return {
            "fields": codec.fields_json(new.fields),
            "id": new.delivery_id,
            "now": new.now_ms,
            "keep_s": new.keep_s,
            "prune_before": new.now_ms - new.keep_s * 1000,
        }

    def claim(self, delivery_id: str, *, now_ms: int, lease_until_ms: int, slack_ms: int) -> Claim:
        """Take the delivery for one attempt (see delivery_claim.lua for the rules)."""
        res = self._lua["delivery_claim"](
            delivery=self.ks.delivery(delivery_id),
            due=self.ks.beside_id(delivery_id).deliveries_due,
            now=now_ms,
            lease_until=lease_until_ms,
            slack_ms=slack_ms,
            id=delivery_id,
        )
        verdict, value = as_text(res[0]), as_text(res[1])
        if verdict == "ok":
            return Claim("ok", attempt=int(value))
        if verdict == "early":
            return Claim("early", due_ms=int(value))
        return Claim(verdict)

    def settle(
        self,
        delivery_id: str,
        attempt: int,
        fields: Mapping[str, Any],
        *,
        ttl_s: int,
        due_ms: int | None,
    ) -> bool:
        """Write the outcome of ``attempt`` if it still holds the delivery: kept ``ttl_s``
        from now (0: as it is), due again at ``due_ms`` (None: final, out of the index)."""
        res = self._lua["delivery_settle"](
            delivery=self.ks.delivery(delivery_id),
            due_index=self.ks.beside_id(delivery_id).deliveries_due,
            attempt=attempt,
            fields=codec.fields_json(fields),
            ttl_s=ttl_s,
            id=delivery_id,
            due="" if due_ms is None else str(due_ms),
        )
        return bool(int(res))

    def take_due(self, now_ms: int, recheck_ms: int, limit: int = 500) -> list[str]:
        """The deliveries whose step is due, each pushed ``recheck_ms`` on (at most
        ``limit`` per slot group)."""
        indexes = (group.deliveries_due for group in self.ks.every_group())
        return take_due(
            self.redis, self._lua, indexes, now_ms=now_ms, recheck_ms=recheck_ms, limit=limit
        )

    def get(self, delivery_id: str) -> dict[str, Any] | None:
        """The delivery as a JSON-ready dict, or None when unknown or expired."""
        raw = self.redis.hgetall(self.ks.delivery(delivery_id))
        return _decode(codec.decode_hash(raw)) if raw else None

    def for_session(self, session_key: str, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` deliveries of a session, newest first (expired ones skipped)."""
        rows = self.redis.zrevrange(self.ks.session_deliveries(session_key), 0, limit - 1)
        pipe = self.redis.pipeline(transaction=False)
        for delivery_id in (as_text(v) for v in rows):
            pipe.hgetall(self.ks.delivery(delivery_id))
        return [_decode(codec.decode_hash(raw)) for raw in pipe.execute() if raw]

    def publish_event(self, event_type: str, data: Mapping[str, Any]) -> None:
        """Append an event to the events stream of the session it names as a send (a
        Redis failure fails the send, unlike `EventStore.publish`, so the delivery is
        retried)."""
        fields = {"type": event_type, "data": codec.dumps(dict(data))}
        session_key = data.get("sessionKey")
        group = self.ks.beside(session_key) if isinstance(session_key, str) else self.ks.home
        self.redis.xadd(
            group.events,
            fields,  # type: ignore[arg-type]
            maxlen=EVENTS_MAXLEN,
            approximate=True,
        )


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
