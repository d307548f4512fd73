"""Channel adapters: how one delivery attempt reaches its channel.

Built in: ``webchat`` (an event on the ``events`` stream, read by the console and
``/events``), ``internal`` (recorded only), and the generic outbound webhook of any channel
configured with ``channels.<name>.webhook: {url, headers}``. A webhook configured for
``webchat`` or ``internal`` takes precedence over the built-in adapter.

The webhook receives ``POST`` JSON ``{channel, to, accountId, threadId, message, sessionKey,
idempotencyKey}`` with an ``Idempotency-Key`` header (a retried delivery repeats the same
key, so the receiver can drop duplicates). 2xx is delivered; 4xx other than 408/429 is a
permanent failure; anything else (5xx, 408, 429, timeouts, connection errors) is retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from switchboard.shared.config import WebhookConfig
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms

_RETRYABLE_4XX = frozenset({408, 429})
# How much of an error response body is kept in `lastError`.
_ERROR_BODY_CHARS = 200


@dataclass(frozen=True)
class SendResult:
    """The outcome of one attempt; ``permanent`` failures are not retried."""

    ok: bool
    error: str | None = None
    permanent: bool = False


DELIVERED = SendResult(ok=True)


def send(svc: Services, delivery: Mapping[str, Any]) -> SendResult:
    """Send one delivery through the adapter of its channel."""
    channel = str(delivery.get("channel") or "")
    configured = svc.config.channels.get(channel)
    if configured is not None and configured.webhook is not None:
        return post_webhook(configured.webhook, delivery, svc.config.delivery.timeout_s)
    if channel == "webchat":
        return publish_webchat(svc, delivery)
    if channel == "internal":
        return DELIVERED
    return SendResult(ok=False, error=f"unsupported channel: {channel}", permanent=True)


def is_local(svc: Services, channel: str) -> bool:
    """Whether ``channel`` is served inside the product (no webhook, no network)."""
    configured = svc.config.channels.get(channel)
    if configured is not None and configured.webhook is not None:
        return False
    return channel in ("webchat", "internal")


def webhook_payload(delivery: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body a webhook receives."""
    return {
        "channel": delivery.get("channel"),
        "to": delivery.get("to"),
        "accountId": delivery.get("accountId"),
        "threadId": delivery.get("threadId"),
        "message": delivery.get("message"),
        "sessionKey": delivery.get("sessionKey"),
        "idempotencyKey": delivery.get("idempotencyKey"),
    }


def post_webhook(
    webhook: WebhookConfig, delivery: Mapping[str, Any], timeout_s: float
) -> SendResult:
    """POST the delivery to a channel's webhook and classify the answer."""
    headers = {**webhook.headers, "Idempotency-Key": str(delivery.get("idempotencyKey") or "")}
    try:
        resp = httpx.post(
            webhook.url, json=webhook_payload(delivery), headers=headers, timeout=timeout_s
        )
    except httpx.TimeoutException:
        return SendResult(ok=False, error=f"webhook timed out after {timeout_s:g}s")
    except httpx.HTTPError as exc:
        return SendResult(ok=False, error=f"webhook unreachable: {type(exc).__name__}: {exc}")
    return classify_status(resp.status_code, resp.text)


def classify_status(status: int, body: str = "") -> SendResult:
    """2xx delivered; 4xx except 408/429 permanent; everything else worth a retry."""
    if 200 <= status < 300:
        return DELIVERED
    detail = body.strip()[:_ERROR_BODY_CHARS]
    error = f"webhook answered HTTP {status}" + (f": {detail}" if detail else "")
    permanent = 400 <= status < 500 and status not in _RETRYABLE_4XX
    return SendResult(ok=False, error=error, permanent=permanent)


def webchat_event(delivery: Mapping[str, Any], ts: int) -> dict[str, Any]:
    """The data of the ``delivery`` event that carries a webchat message."""
    return {
        "deliveryId": delivery.get("deliveryId"),
        "sessionKey": delivery.get("sessionKey"),
        "channel": delivery.get("channel"),
        "to": delivery.get("to"),
        "threadId": delivery.get("threadId"),
        "message": delivery.get("message"),
        "ts": ts,
    }


def settled_event(
    delivery: Mapping[str, Any], attempt: int, status: str, error: str | None
) -> dict[str, Any]:
    """The data of a ``delivery.settled`` event (the console follows it)."""
    data = {
        "deliveryId": delivery.get("deliveryId"),
        "sessionKey": delivery.get("sessionKey"),
        "channel": delivery.get("channel"),
        "status": status,
        "attempts": attempt,
        "error": error,
    }
    return {k: v for k, v in data.items() if v is not None}


def publish_webchat(svc: Services, delivery: Mapping[str, Any]) -> SendResult:
    """Append a ``delivery`` event to the events stream (console and ``/events`` read it)."""
    svc.store.deliveries.publish_event("delivery", webchat_event(delivery, now_ms()))
    return DELIVERED
