"""Durable outbound delivery: record once, send through the channel adapter, retry, record.

``enqueue_delivery`` writes the delivery (its id derives from the idempotency key, so a
second call is a no-op) and enqueues the step ``switchboard.deliver``. The step checks the
session's send policy (deny → ``denied``), takes one attempt, and settles it: ``delivered``
exactly once, a retry with exponential backoff (``delivery.maxAttempts``,
``backoffBaseS``, ``backoffMaxS``; the step re-enqueues itself with a countdown), or
``failed`` with ``lastError`` after a permanent error or the last attempt. Outcomes stay
readable with ``get_delivery`` / ``deliveries_for`` for ``runs.retentionHours``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from switchboard.shared.delivery import adapters, records
from switchboard.shared.delivery.records import Target
from switchboard.shared.flows.steps import flow_step
from switchboard.shared.gateway.agent import SendBlocked, check_send_policy
from switchboard.shared.policy.send_policy import SEND_BLOCKED
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms

log = logging.getLogger("switchboard.delivery")

DELIVER_STEP = "switchboard.deliver"
# Beyond the adapter's own timeout, how long an attempt may hold the delivery before a
# redelivered step may take it over (the first worker is presumed dead).
_LEASE_GRACE_S = 30.0


def enqueue_delivery(
    svc: Services,
    *,
    target: Target,
    message: str,
    session_key: str,
    idempotency_key: str,
    origin: Mapping[str, str],
) -> str:
    """Record a pending delivery and enqueue its step; returns the delivery id.

    Idempotent: the same ``idempotency_key`` names the same delivery, which is created
    and enqueued once (a record left unsent by a crash is enqueued again).
    """
    delivery_id, created = records.create(
        svc,
        target=target,
        message=message,
        session_key=session_key,
        idempotency_key=idempotency_key,
        origin=origin,
    )
    if created or _never_attempted(svc, delivery_id):
        svc.queue.enqueue(DELIVER_STEP, delivery_id)
    return delivery_id


def _never_attempted(svc: Services, delivery_id: str) -> bool:
    found = records.get(svc, delivery_id)
    return found is not None and found.get("status") == "pending" and not found.get("attempts")


def get_delivery(svc: Services, delivery_id: str) -> dict[str, Any] | None:
    """One delivery (status, attempts, lastError, target, message), or None."""
    return records.get(svc, delivery_id)


def deliveries_for(svc: Services, session_key: str, limit: int = 20) -> list[dict[str, Any]]:
    """The newest deliveries concerning a session, newest first."""
    return records.for_session(svc, session_key, max(1, limit))


def backoff_s(svc: Services, attempt: int) -> float:
    """The wait before the attempt after ``attempt``: base · 2^(attempt-1), capped."""
    cfg = svc.config.delivery
    return float(min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** max(0, attempt - 1)))


@flow_step(DELIVER_STEP)
def deliver(svc: Services, delivery_id: str) -> None:
    """Take one attempt at a delivery, unless it is settled, busy or not yet due."""
    cfg = svc.config.delivery
    lease_ms = int((cfg.timeout_s + _LEASE_GRACE_S) * 1000)
    claim = records.claim(svc, delivery_id, lease_ms)
    if claim.verdict == "early":
        # A duplicate step before the retry is due: come back when it is (the step that
        # then finds the delivery settled or busy does nothing).
        svc.queue.enqueue(DELIVER_STEP, delivery_id, countdown_s=_seconds_until(claim.due_ms))
        return
    if claim.verdict != "ok":
        log.debug("delivery %s: nothing to do (%s)", delivery_id, claim.verdict)
        return
    delivery = records.get(svc, delivery_id)
    if delivery is None:
        return
    _attempt(svc, delivery, claim.attempt)


def _attempt(svc: Services, delivery: Mapping[str, Any], attempt: int) -> None:
    delivery_id = str(delivery["deliveryId"])
    max_attempts = svc.config.delivery.max_attempts
    if attempt > max_attempts:  # earlier attempts died mid-send
        _settle(svc, delivery_id, attempt, "failed", f"gave up after {max_attempts} attempts")
        return
    if _denied(svc, delivery):
        _settle(svc, delivery_id, attempt, "denied", SEND_BLOCKED)
        return
    try:
        result = adapters.send(svc, delivery)
    except Exception as exc:  # an adapter bug or a store blip: count it and retry
        log.exception("delivery %s: adapter raised", delivery_id)
        result = adapters.SendResult(ok=False, error=f"{type(exc).__name__}: {exc}")
    if result.ok:
        records.settle(
            svc, delivery_id, attempt, {"status": "delivered", "deliveredAt": now_ms()}, final=True
        )
        return
    if result.permanent or attempt >= max_attempts:
        _settle(svc, delivery_id, attempt, "failed", result.error)
        return
    delay_s = backoff_s(svc, attempt)
    retry = {
        "status": "pending",
        "lastError": result.error,
        "nextAttemptAt": now_ms() + int(delay_s * 1000),
    }
    if records.settle(svc, delivery_id, attempt, retry, final=False):
        log.info(
            "delivery %s: attempt %d failed (%s); retry in %gs",
            delivery_id,
            attempt,
            result.error,
            delay_s,
        )
        svc.queue.enqueue(DELIVER_STEP, delivery_id, countdown_s=delay_s)


def _settle(svc: Services, delivery_id: str, attempt: int, status: str, error: str | None) -> None:
    log.warning("delivery %s %s: %s", delivery_id, status, error)
    records.settle(svc, delivery_id, attempt, {"status": status, "lastError": error}, final=True)


def _denied(svc: Services, delivery: Mapping[str, Any]) -> bool:
    """The session's send policy forbids delivering to its channel."""
    key = str(delivery.get("sessionKey") or "")
    try:
        check_send_policy(svc, key, channel=str(delivery.get("channel") or "") or None)
    except SendBlocked:
        return True
    return False


def _seconds_until(at_ms: int) -> float:
    return max(0.0, (at_ms - now_ms()) / 1000)
