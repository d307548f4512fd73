"""Durable delivery through the channel adapters, with a real worker and a loopback webhook."""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from switchboard.shared.delivery import (
    DELIVER_STEP,
    Target,
    deliveries_for,
    enqueue_delivery,
    get_delivery,
    records,
)
from switchboard.shared.flows.steps import run_step
from switchboard.shared.policy.send_policy import SEND_BLOCKED
from switchboard.shared.services import Services
from switchboard_testkit import store_reads
from switchboard_testkit.webhook_receiver import WebhookReceiver

# Retries are due in the due index and enqueued by the recovery sweep (every 0.3 s here).
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sweeper")]

ROOM = "agent:main:relay:group:room1"
RELAY = Target(channel="relay", to="group:room1", account_id="bot-1", thread_id="t-9")
# A channel whose webhook port has nothing listening: every attempt is refused.
DEAD = Target(channel="dead", to="group:room1")


@pytest.fixture
def config_data(webhook: WebhookReceiver) -> dict[str, Any]:
    """The `relay` channel bridged to the receiver; fast retries for the tests."""
    return {
        "channels": {
            "relay": {"webhook": {"url": webhook.url, "headers": {"X-Relay-Token": "s3cret"}}},
            "dead": {"webhook": {"url": _refusing_url()}},
        },
        "delivery": {"maxAttempts": 3, "backoffBaseS": 0.3, "backoffMaxS": 2, "timeoutS": 0.5},
    }


def _refusing_url() -> str:
    """A loopback URL whose port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def _enqueue(services: Services, key: str, *, target: Target = RELAY, message: str = "hi") -> str:
    return enqueue_delivery(
        services,
        target=target,
        message=message,
        session_key=ROOM,
        idempotency_key=key,
        origin={"kind": "test"},
    )


def _settled(services: Services, delivery_id: str, timeout_s: float = 20) -> dict[str, Any]:
    """Poll until the delivery reaches a final status."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = get_delivery(services, delivery_id)
        if found is not None and found["status"] in records.TERMINAL_STATUSES:
            return found
        assert time.monotonic() < deadline, f"delivery not settled: {found}"
        time.sleep(0.05)


def test_webhook_gets_the_contract_payload_once(
    worker: Any, services: Services, webhook: WebhookReceiver
) -> None:
    """A delivery POSTs the documented JSON with Idempotency-Key and the configured headers."""
    delivery_id = _enqueue(services, "idem-1", message="hello room")
    done = _settled(services, delivery_id)
    assert done["status"] == "delivered"
    assert done["attempts"] == 1
    assert done["deliveredAt"] > 0
    (request,) = webhook.received
    assert request.body == {
        "channel": "relay",
        "to": "group:room1",
        "accountId": "bot-1",
        "threadId": "t-9",
        "message": "hello room",
        "sessionKey": ROOM,
        "idempotencyKey": "idem-1",
    }
    assert request.headers["idempotency-key"] == "idem-1"
    assert request.headers["x-relay-token"] == "s3cret"


def test_enqueuing_the_same_key_twice_is_one_delivery(
    worker: Any, services: Services, webhook: WebhookReceiver
) -> None:
    """The delivery id derives from the idempotency key; a second enqueue sends nothing more."""
    first = _enqueue(services, "idem-twice")
    _settled(services, first)
    second = _enqueue(services, "idem-twice", message="something else")
    assert second == first
    time.sleep(0.5)
    assert len(webhook.received) == 1
    assert get_delivery(services, first)["message"] == "hi"  # type: ignore[index]
    assert [d["deliveryId"] for d in deliveries_for(services, ROOM)] == [first]


def test_failures_are_retried_with_backoff_then_delivered(
    worker: Any, services: Services, webhook: WebhookReceiver
) -> None:
    """500 then 429 then 200: three attempts, same key, gaps growing from backoffBaseS."""
    webhook.respond(500, 429)
    delivery_id = _enqueue(services, "idem-retry")
    done = _settled(services, delivery_id)
    assert done["status"] == "delivered"
    assert done["attempts"] == 3
    assert "HTTP 429" in done["lastError"]
    requests = webhook.received
    assert [r.status for r in requests] == [500, 429, 200]
    assert set(webhook.idempotency_keys()) == {"idem-retry"}
    gaps = [b.at - a.at for a, b in itertools.pairwise(requests)]
    assert gaps[0] >= 0.3 * 0.9
    assert gaps[1] >= 0.6 * 0.9


def test_client_error_is_a_permanent_failure(
    worker: Any, services: Services, webhook: WebhookReceiver
) -> None:
    """A 404 is not retried: one request, status failed, the error recorded."""
    webhook.respond(404)
    delivery_id = _enqueue(services, "idem-404")
    done = _settled(services, delivery_id)
    assert done["status"] == "failed"
    assert done["attempts"] == 1
    assert "HTTP 404" in done["lastError"]
    time.sleep(0.8)
    assert len(webhook.received) == 1


def test_last_attempt_failing_is_recorded_failed(
    worker: Any, services: Services, webhook: WebhookReceiver
) -> None:
    """A webhook that keeps answering 500 gets maxAttempts tries, then `failed`, listed."""
    webhook.default_status = 500
    delivery_id = _enqueue(services, "idem-500")
    done = _settled(services, delivery_id)
    assert done["status"] == "failed"
    assert done["attempts"] == 3
    assert "HTTP 500" in done["lastError"]
    assert len(webhook.received) == 3
    (listed,) = deliveries_for(services, ROOM)
    assert listed["status"] == "failed"


def test_a_hanging_webhook_times_out_and_is_retried(
    worker: Any, services: Services, webhook: WebhookReceiver
) -> None:
    """An answer slower than delivery.timeoutS counts as a failed attempt."""
    webhook.hang_s = 1.5
    delivery_id = _enqueue(services, "idem-hang")
    done = _settled(services, delivery_id, timeout_s=30)
    assert done["status"] == "failed"
    assert done["attempts"] == 3
    assert "timed out" in done["lastError"]


def test_send_policy_deny_is_recorded_denied(
    worker: Any, services: Services, webhook: WebhookReceiver
) -> None:
    """A session whose send policy denies gets no request; the delivery says `denied`."""
    services.store.sessions.ensure(ROOM)
    services.store.sessions.patch(ROOM, {"sendPolicy": "deny"})
    delivery_id = _enqueue(services, "idem-denied")
    done = _settled(services, delivery_id)
    assert done["status"] == "denied"
    assert done["lastError"] == SEND_BLOCKED
    assert webhook.received == []


def test_unknown_channel_fails_with_a_clear_error(worker: Any, services: Services) -> None:
    """A channel with no webhook that is not webchat/internal fails at once, not silently."""
    delivery_id = _enqueue(services, "idem-smoke", target=Target(channel="smoke", to="hill"))
    done = _settled(services, delivery_id)
    assert done["status"] == "failed"
    assert done["lastError"] == "unsupported channel: smoke"
    assert done["attempts"] == 1


def test_webchat_delivery_is_an_event_and_internal_is_recorded(
    worker: Any, services: Services
) -> None:
    """webchat appends a `delivery` event to the events stream; internal only records."""
    web = _enqueue(services, "idem-web", target=Target(channel="webchat"), message="to console")
    internal = _enqueue(services, "idem-int", target=Target(channel="internal"))
    assert _settled(services, web)["status"] == "delivered"
    assert _settled(services, internal)["status"] == "delivered"
    webchat = store_reads.events(services.store, "delivery")  # plus one delivery.settled each
    assert len(webchat) == 1
    data = webchat[0]
    assert data["deliveryId"] == web
    assert data["message"] == "to console"


def _events(services: Services, event_type: str) -> list[dict[str, Any]]:
    return store_reads.events(services.store, event_type)


def _counted(services: Services, outcome: str) -> float:
    """The process's count of deliveries settled with ``outcome`` (0 when none)."""
    found = services.metrics.registry.get_sample_value(
        "switchboard_deliveries_total", {"outcome": outcome}
    )
    return found or 0.0


def test_local_delivery_is_settled_in_its_step_once_and_counted(services: Services) -> None:
    """With no worker at all: a webchat delivery is recorded, sent and settled by the call;
    the same key again is the same delivery, sent once."""
    before = _counted(services, "delivered")
    first = _enqueue(services, "idem-local", target=Target(channel="webchat"), message="now")
    again = _enqueue(services, "idem-local", target=Target(channel="webchat"), message="now")
    assert first == again
    done = get_delivery(services, first)
    assert done is not None
    assert (done["status"], done["attempts"]) == ("delivered", 1)
    assert done["deliveredAt"] >= done["createdAt"]
    assert [e["deliveryId"] for e in _events(services, "delivery")] == [first]
    [settled] = _events(services, "delivery.settled")
    assert (settled["status"], settled["attempts"], settled["sessionKey"]) == ("delivered", 1, ROOM)
    after = _counted(services, "delivered")
    assert after == before + 1
    due = store_reads.index_members(services.store, "deliveries_due")
    assert due == []  # nothing left for the sweep
    assert [d["deliveryId"] for d in deliveries_for(services, ROOM)] == [first]


def test_local_delivery_obeys_the_sessions_own_deny(services: Services) -> None:
    """A session set to deny (any case, padded) gets no webchat message: `denied`, counted."""
    services.store.sessions.ensure(ROOM)
    services.store.sessions.patch(ROOM, {"sendPolicy": " Deny "})
    delivery_id = _enqueue(services, "idem-local-deny", target=Target(channel="webchat"))
    done = get_delivery(services, delivery_id)
    assert done is not None
    assert (done["status"], done["lastError"]) == ("denied", SEND_BLOCKED)
    assert _events(services, "delivery") == []
    [settled] = _events(services, "delivery.settled")
    assert (settled["status"], settled["error"]) == ("denied", SEND_BLOCKED)
    assert _counted(services, "denied") == 1


def test_local_delivery_obeys_send_policy_rules(services: Services, settings: Any) -> None:
    """With send-policy rules configured, they decide a local delivery too."""
    from switchboard.shared.config import parse_config
    from switchboard.wiring import build_services

    ruled = build_services(
        settings,
        queue=services.queue,
        config=parse_config(
            {
                "session": {
                    "sendPolicy": {
                        "rules": [{"match": {"channel": "webchat"}, "action": "deny"}],
                        "default": "allow",
                    }
                }
            }
        ),
    )
    denied = _enqueue(ruled, "idem-rule-deny", target=Target(channel="webchat"))
    allowed = _enqueue(ruled, "idem-rule-allow", target=Target(channel="internal"))
    assert get_delivery(ruled, denied)["status"] == "denied"  # type: ignore[index]
    assert get_delivery(ruled, allowed)["status"] == "delivered"  # type: ignore[index]


def test_duplicated_deliver_steps_deliver_once(
    worker: Any, services: Services, webhook: WebhookReceiver
) -> None:
    """Five copies of the step at once, and one more after, make exactly one POST."""
    delivery_id, created = records.create(
        services, records.Outgoing(RELAY, "once", ROOM, "idem-dup", {"kind": "test"})
    )
    assert created
    for _ in range(5):
        services.queue.enqueue(DELIVER_STEP, delivery_id)
    assert _settled(services, delivery_id)["status"] == "delivered"
    run_step(services, DELIVER_STEP, delivery_id)
    time.sleep(0.5)
    assert len(webhook.received) == 1
    assert get_delivery(services, delivery_id)["attempts"] == 1  # type: ignore[index]


def test_refused_connections_are_retried_then_failed_and_listed(
    worker: Any, services: Services, rpc: Callable[..., Any]
) -> None:
    """Connection refused on every try: maxAttempts tries, `failed`, shown by deliveries.list."""
    delivery_id = _enqueue(services, "idem-refused", target=DEAD)
    done = _settled(services, delivery_id)
    assert done["status"] == "failed"
    assert done["attempts"] == 3
    assert done["lastError"].startswith("webhook unreachable: ConnectError")
    listed = rpc("deliveries.list", sessionKey=ROOM)
    assert listed["count"] == 1
    (row,) = listed["deliveries"]
    assert (row["deliveryId"], row["status"], row["attempts"]) == (delivery_id, "failed", 3)
    assert row["lastError"] == done["lastError"]
    key = services.store.ks.beside_id(delivery_id).deliveries_due
    assert services.store.redis.zscore(key, delivery_id) is None


def test_a_pending_retry_sits_in_the_due_index_until_it_is_due(
    worker: Any, services: Services, webhook: WebhookReceiver
) -> None:
    """After a failed attempt the retry is due at nextAttemptAt; settling removes it."""
    webhook.respond(500)
    delivery_id = _enqueue(services, "idem-due")
    key = services.store.ks.beside_id(delivery_id).deliveries_due
    deadline = time.monotonic() + 10
    while (found := get_delivery(services, delivery_id)) is None or not found.get("lastError"):
        assert time.monotonic() < deadline, f"first attempt not settled: {found}"
        time.sleep(0.02)
    if found["status"] == "pending":  # the sweep may already have taken the retry
        assert services.store.redis.zscore(key, delivery_id) == found["nextAttemptAt"]
    assert _settled(services, delivery_id)["status"] == "delivered"
    assert services.store.redis.zscore(key, delivery_id) is None
