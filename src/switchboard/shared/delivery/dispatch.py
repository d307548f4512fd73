"""Durable outbound delivery: record once, send through the channel adapter, retry, record.

``enqueue_delivery`` writes the delivery (its id derives from the idempotency key, so a
second call is a no-op) and enqueues the step ``switchboard.deliver``. The step checks the
session's send policy (deny → ``denied``), takes one attempt, and settles it: ``delivered``
exactly once, a retry with exponential backoff (``delivery.maxAttempts``,
``backoffBaseS``, ``backoffMaxS``), or ``failed`` with ``lastError`` after a permanent
error or the last attempt. Outcomes stay readable with ``get_delivery`` /
``deliveries_for`` for ``runs.retentionHours``.

Retries are not Celery countdowns (a countdown held by a worker that dies comes back
only after the broker's visibility timeout): a retry is due in the due index, and the
recovery sweep enqueues every step that is due (``enqueue_due``) — a retry whose time
has come, an attempt whose worker died mid-send (its lease ran out), or a first step lost
with its worker. A step that finds its delivery settled, busy or not yet due does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from switchboard.logs import log_context
from switchboard.shared.delivery import adapters, records
from switchboard.shared.delivery.records import Outgoing, Target
from switchboard.shared.policy.send_policy import SEND_BLOCKED, session_send_decision
from switchboard.shared.services import Services
from switchboard.shared.step_registry import flow_step
from switchboard.shared.store import Pipeline
from switchboard.shared.store.deliveries import DeliveryStore
from switchboard.shared.store.runs import now_ms

log = logging.getLogger("switchboard.delivery")

DELIVER_STEP = "switchboard.deliver"


def enqueue_delivery(
    svc: Services,
    *,
    target: Target,
    message: str,
    session_key: str,
    idempotency_key: str,
    origin: Mapping[str, str],
) -> str:
    """Record a pending delivery and send it; returns the delivery id.

    A channel served inside the product (``webchat``, ``internal``) is delivered at once:
    the record, the send (a store write, no network) and its outcome are one atomic store
    step, so there is no task and no half-done state to recover. Any other channel gets its
    delivery step enqueued, with the record in the due index first, so an attempt lost with
    its worker is made again by the sweep.

    Idempotent: the same ``idempotency_key`` names the same delivery, which is created
    and sent once (a record left unsent by a crash is sent again).
    """
    out = Outgoing(target, message, session_key, idempotency_key, origin)
    if adapters.is_local(svc, target.channel):
        return _deliver_local(svc, out)
    return _enqueue_remote(svc, out)


def queue_delivery(
    svc: Services,
    pipe: Pipeline,
    *,
    target: Target,
    message: str,
    session_key: str,
    idempotency_key: str,
    origin: Mapping[str, str],
) -> tuple[str, Callable[[Sequence[Any]], None]]:
    """`enqueue_delivery` with the store step of a channel served inside the product
    queued on ``pipe``: answers the delivery id and what is done with the pipeline's
    replies once it is executed (the caller calls it). Any other channel's delivery is
    recorded and its step enqueued here and now, as `enqueue_delivery` does."""
    out = Outgoing(target, message, session_key, idempotency_key, origin)
    if not adapters.is_local(svc, target.channel):
        return _enqueue_remote(svc, out), lambda replies: None
    return out.delivery_id, _queue_local(svc, out, pipe)


def _enqueue_remote(svc: Services, out: Outgoing) -> str:
    delivery_id, created = records.create(svc, out)
    if created or _never_attempted(svc, delivery_id):
        svc.queue.enqueue(DELIVER_STEP, delivery_id)
    return delivery_id


def _deliver_local(svc: Services, out: Outgoing) -> str:
    """Record, send and settle a webchat or internal delivery in one store step."""
    pipe = svc.store.pipeline()
    settled = _queue_local(svc, out, pipe)
    settled(pipe.execute())
    return out.delivery_id


def _queue_local(svc: Services, out: Outgoing, pipe: Pipeline) -> Callable[[Sequence[Any]], None]:
    """Queue the one store step of a local delivery on ``pipe``; answers what reads its
    reply. Without send-policy rules the session's own override decides, read in that
    step."""
    policy = None
    if svc.config.session.send_policy is not None:
        denied = _session_denies(svc, out.session_key, out.target.channel)
        policy = "deny" if denied else "allow"
    at = len(pipe)
    records.create_local(svc, out, policy=policy, client=pipe)
    delivery_id = out.delivery_id

    def settled(replies: Sequence[Any]) -> None:
        outcome = DeliveryStore.local_outcome(replies[at])
        if outcome is not None:
            svc.metrics.delivery(outcome)
        if outcome is None and _never_attempted(svc, delivery_id):
            deliver(svc, delivery_id)  # recorded earlier but never sent: send it now
        elif outcome == "denied":
            log.warning("delivery %s denied: %s", delivery_id, SEND_BLOCKED)

    return settled


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


@flow_step(DELIVER_STEP, log_ids=("deliveryId",))
def deliver(svc: Services, delivery_id: str) -> None:
    """Take one attempt at a delivery, unless it is settled, busy or not yet due."""
    # An attempt holds the delivery this long; after it, its worker is presumed dead.
    claim = records.claim(svc, delivery_id, records.lost_after_ms(svc))
    if claim.verdict != "ok":
        # early: the sweep enqueues it when due; busy, done, missing: nothing to do.
        log.debug("delivery %s: nothing to do (%s)", delivery_id, claim.verdict)
        return
    delivery = records.get(svc, delivery_id)
    if delivery is None:
        return
    origin: Mapping[str, Any] = delivery.get("origin") or {}
    with log_context(
        sessionKey=delivery.get("sessionKey"),
        flowId=origin.get("flowId"),
        spawnId=origin.get("spawnId"),
    ):
        _attempt(svc, delivery, claim.attempt)


def _attempt(svc: Services, delivery: Mapping[str, Any], attempt: int) -> None:
    delivery_id = str(delivery["deliveryId"])
    if delivery.get("status") != "sending" or str(delivery.get("attempts")) != str(attempt):
        # Read after the claim answered: a worker cut off from the store past the attempt's
        # lease, whose claim's answer came after the heal, finds another attempt has the
        # delivery (or settled it): it must not post it a second time.
        log.warning(
            "fenced: delivery %s attempt %d: send refused (attempt %s holds it, %s)",
            delivery_id,
            attempt,
            delivery.get("attempts"),
            delivery.get("status"),
            extra={"deliveryId": delivery_id, "fenced": "delivery"},
        )
        return
    max_attempts = svc.config.delivery.max_attempts
    if attempt > max_attempts:  # earlier attempts died mid-send
        _settle(svc, delivery, attempt, "failed", f"gave up after {max_attempts} attempts")
        return
    if _denied(svc, delivery):
        _settle(svc, delivery, attempt, "denied", SEND_BLOCKED)
        return
    try:
        result = adapters.send(svc, delivery)
    except Exception as exc:  # an adapter bug or a store blip: count it and retry
        log.exception("delivery %s: adapter raised", delivery_id)
        result = adapters.SendResult(ok=False, error=f"{type(exc).__name__}: {exc}")
    if result.ok:
        done = {"status": "delivered", "deliveredAt": now_ms()}
        if records.settle(svc, delivery_id, attempt, done, final=True):
            svc.metrics.delivery("delivered")
            _publish_settled(svc, delivery, attempt, "delivered", None)
        return
    if result.permanent or attempt >= max_attempts:
        _settle(svc, delivery, attempt, "failed", result.error)
        return
    delay_s = backoff_s(svc, attempt)
    retry = {
        "status": "pending",
        "lastError": result.error,
        "nextAttemptAt": now_ms() + int(delay_s * 1000),
    }
    if records.settle(svc, delivery_id, attempt, retry, final=False):
        svc.metrics.delivery("retry")
        # Now due in the due index: the sweep enqueues the next attempt at its time.
        log.info(
            "delivery %s: attempt %d failed (%s); retry in %gs",
            delivery_id,
            attempt,
            result.error,
            delay_s,
        )


def enqueue_due(svc: Services, now: int) -> int:
    """Enqueue the step of every delivery that is due (the sweep); returns how many.

    Each is looked at again after ``records.lost_after_ms`` unless its step claims or
    settles it first, so a step lost again is enqueued again."""
    due = records.take_due(svc, now, records.lost_after_ms(svc))
    for delivery_id in due:
        svc.queue.enqueue(DELIVER_STEP, delivery_id)
    return len(due)


def _settle(
    svc: Services, delivery: Mapping[str, Any], attempt: int, status: str, error: str | None
) -> None:
    delivery_id = str(delivery["deliveryId"])
    log.warning("delivery %s %s: %s", delivery_id, status, error)
    fields = {"status": status, "lastError": error}
    if records.settle(svc, delivery_id, attempt, fields, final=True):
        svc.metrics.delivery(status)
        _publish_settled(svc, delivery, attempt, status, error)


def _publish_settled(
    svc: Services, delivery: Mapping[str, Any], attempt: int, status: str, error: str | None
) -> None:
    """A ``delivery.settled`` event on the events stream (the console follows it)."""
    event = adapters.settled_event(delivery, attempt, status, error)
    svc.store.events.publish("delivery.settled", event)


def _denied(svc: Services, delivery: Mapping[str, Any]) -> bool:
    """The session's send policy forbids delivering to its channel."""
    key = str(delivery.get("sessionKey") or "")
    return _session_denies(svc, key, str(delivery.get("channel") or ""))


def _session_denies(svc: Services, session_key: str, channel: str) -> bool:
    entry = svc.store.sessions.get(session_key)
    fields = entry.fields if entry is not None else None
    return session_send_decision(svc.config, session_key, fields, channel=channel or None) == "deny"
