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
is presumed lost with its worker. The sweep enqueues what is due (``take_due``).

This module decides what a delivery holds and when; ``store.deliveries`` (`DeliveryStore`)
keeps it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from switchboard.shared.delivery import adapters
from switchboard.shared.policy.send_policy import SEND_BLOCKED
from switchboard.shared.services import Services
from switchboard.shared.store import Pipeline, slot_groups
from switchboard.shared.store.deliveries import Claim, LocalOutcome, NewDelivery
from switchboard.shared.store.runs import now_ms

__all__ = [
    "TERMINAL_STATUSES",
    "Claim",
    "Outgoing",
    "Target",
    "claim",
    "create",
    "create_local",
    "delivery_id_for",
    "for_session",
    "get",
    "lost_after_ms",
    "retention_s",
    "settle",
    "take_due",
]

TERMINAL_STATUSES = frozenset({"delivered", "failed", "denied"})
# Delivery ids are derived from the idempotency key, so the same key is the same delivery.
_ID_NAMESPACE = uuid.UUID("5b0c6f1e-3c1d-4d7e-9f5a-2f1e8f7c9a41")
# A step that wakes up this much before its retry is due still runs (clock jitter).
_DUE_SLACK_MS = 250


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
        return delivery_id_for(self.idempotency_key, self.session_key)

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


def delivery_id_for(idempotency_key: str, session_key: str) -> str:
    """The delivery id of an idempotency key (deterministic), in the slot group of the
    session it concerns (`slot_groups.id_beside`): its record, the session's index of
    deliveries and the group's due index are written in one step."""
    return slot_groups.id_beside(session_key, str(uuid.uuid5(_ID_NAMESPACE, idempotency_key)))


def retention_s(svc: Services) -> int:
    """How long settled deliveries (and session indexes) are kept: the run retention."""
    return max(60, int(svc.config.runs.retention_hours * 3600))


def create(svc: Services, out: Outgoing) -> tuple[str, bool]:
    """Record a pending delivery; returns (id, created) — False when it already existed."""
    new = _new_delivery(svc, out, now_ms())
    created = svc.store.deliveries.create(new, lost_at_ms=new.now_ms + lost_after_ms(svc))
    return out.delivery_id, created


def create_local(
    svc: Services, out: Outgoing, *, policy: str | None, client: Pipeline | None = None
) -> tuple[str, str | None]:
    """Record and settle a delivery to a channel served inside the product, in one step.

    ``policy`` is the send policy's decision (``allow``/``deny``), or None to go by the
    session's own override alone (no send-policy rules are configured). Returns (id,
    outcome): ``delivered`` or ``denied``, None when the delivery already existed; queued
    on ``client``, the outcome is None (its reply there: `DeliveryStore.local_outcome`)."""
    new = _new_delivery(svc, out, now_ms())
    fields, now = new.fields, new.now_ms
    webchat = adapters.webchat_event(fields, now) if out.target.channel == "webchat" else None
    outcome = LocalOutcome(
        policy=policy or "",
        webchat_event=webchat,
        delivered_event={**adapters.settled_event(fields, 1, "delivered", None), "ts": now},
        denied_event={**adapters.settled_event(fields, 1, "denied", SEND_BLOCKED), "ts": now},
        denied_error=SEND_BLOCKED,
    )
    return out.delivery_id, svc.store.deliveries.create_local(new, outcome, client=client)


def _new_delivery(svc: Services, out: Outgoing, now: int) -> NewDelivery:
    """The record of a new delivery, kept (once settled) for the retention."""
    return NewDelivery(
        delivery_id=out.delivery_id,
        session_key=out.session_key,
        fields=out.new_fields(now),
        now_ms=now,
        keep_s=retention_s(svc),
    )


def lost_after_ms(svc: Services) -> int:
    """How long an enqueued or sending step may take before it is presumed lost with its
    worker: the adapter's timeout plus the lane lease (``SWITCHBOARD_LANE_LEASE_S``)."""
    return int((svc.config.delivery.timeout_s + svc.settings.lane_lease_s) * 1000)


def claim(svc: Services, delivery_id: str, lease_ms: int) -> Claim:
    """Take the delivery for one attempt: a pending one that is due, or one whose sender
    lost its lease (the rules are delivery_claim.lua's)."""
    now = now_ms()
    return svc.store.deliveries.claim(
        delivery_id, now_ms=now, lease_until_ms=now + lease_ms, slack_ms=_DUE_SLACK_MS
    )


def settle(
    svc: Services, delivery_id: str, attempt: int, fields: Mapping[str, Any], *, final: bool
) -> bool:
    """Write the outcome of ``attempt``; a final outcome starts the retention clock and
    leaves the due index, a retry is due at ``fields["nextAttemptAt"]``."""
    return svc.store.deliveries.settle(
        delivery_id,
        attempt,
        {**fields, "updatedAt": now_ms()},
        ttl_s=retention_s(svc) if final else 0,
        due_ms=None if final else int(fields["nextAttemptAt"]),
    )


def take_due(svc: Services, now: int, recheck_ms: int, limit: int = 500) -> list[str]:
    """The deliveries whose step is due, each pushed ``recheck_ms`` on (a later sweep
    enqueues it again if that step is lost too; settling removes it)."""
    return svc.store.deliveries.take_due(now, recheck_ms, limit)


def get(svc: Services, delivery_id: str) -> dict[str, Any] | None:
    """The delivery as a JSON-ready dict, or None when unknown or expired."""
    return svc.store.deliveries.get(delivery_id)


def for_session(svc: Services, session_key: str, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` deliveries of a session, newest first (expired ones skipped)."""
    return svc.store.deliveries.for_session(session_key, limit)
