"""Follow-up work held by a worker that is killed: a pending delivery retry and a
sub-agent announce waiting for its requester's turn are not lost with the worker.

Celery holds countdown (eta) messages in the worker that reserved them; after a kill -9
they come back only after the broker's visibility timeout (2 h). These tests kill the
worker while such work is pending and expect a new worker and beat to finish it in
seconds.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from faultkit import CHANNEL, Cluster, idempotency_counts, wait_until

from switchboard.shared.delivery import Target, enqueue_delivery, get_delivery
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.faults


@pytest.mark.parametrize(
    "extra_config", [{"delivery": {"backoffBaseS": 4, "backoffMaxS": 4, "maxAttempts": 3}}]
)
def test_a_pending_delivery_retry_survives_kill_9(
    cluster: Cluster, webhook: WebhookReceiver
) -> None:
    """The first attempt fails, the worker dies before the retry: the retry still happens."""
    first = cluster.worker(concurrency=4)
    webhook.respond(500)
    delivery_id = enqueue_delivery(
        cluster.services,
        target=Target(channel=CHANNEL, to="group:retry"),
        message="after the crash",
        session_key=f"agent:main:{CHANNEL}:group:retry",
        idempotency_key="retry-after-kill",
        origin={"kind": "test"},
    )

    def failed_once() -> dict[str, Any] | None:
        found = get_delivery(cluster.services, delivery_id)
        return found if found and found["status"] == "pending" and found["attempts"] else None

    pending = wait_until(failed_once, 20, "the first attempt to fail")
    cluster.kill(first)
    killed_at = time.monotonic()
    cluster.worker(concurrency=4)
    cluster.beat()

    def delivered() -> dict[str, Any] | None:
        found = get_delivery(cluster.services, delivery_id)
        return found if found and found["status"] == "delivered" else None

    done = wait_until(delivered, 30, "the retry after the kill")
    waited = time.monotonic() - killed_at
    print(f"\nretry delivered {waited:.1f}s after the kill (due {pending['nextAttemptAt']})")
    assert done["attempts"] == 2
    assert done["deliveredAt"] >= pending["nextAttemptAt"]
    assert [r.status for r in webhook.received] == [500, 200]
    assert idempotency_counts(webhook) == {"retry-after-kill": 1}


def test_an_announce_waiting_for_its_requester_survives_kill_9(
    cluster: Cluster, webhook: WebhookReceiver
) -> None:
    """A child ends while its requester's next run executes (the announce waits for that
    run); the worker is killed then: the announce is still appended and delivered, once."""
    first = cluster.worker(concurrency=8)
    parent = f"agent:main:{CHANNEL}:group:busy"
    spawn_line = "/tool sessions_spawn " + json.dumps({"task": "quick child\n/sleep 2"})
    svc = cluster.services
    start_run(svc, RunRequest(session_key=parent, message=spawn_line))
    busy = start_run(svc, RunRequest(session_key=parent, message="/sleep 8\nbusy"))["runId"]

    def child_ended_while_busy() -> bool:
        spawns = cluster.spawns()
        run = svc.store.runs.get(busy)
        return bool(spawns and spawns[0].get("outcome") and run and run.status == "running")

    wait_until(child_ended_while_busy, 30, "the child to end while the parent is busy", 0.05)
    time.sleep(1.5)  # the announce step has re-enqueued itself at least once by now
    (spawn,) = cluster.spawns()
    assert spawn.get("announce") is None, spawn  # still waiting for the parent's turn
    cluster.kill(first)
    killed_at = time.monotonic()
    cluster.worker(concurrency=8)
    cluster.beat()

    def announced() -> bool:
        (found,) = cluster.spawns()
        return found.get("status") == "done" and bool(idempotency_counts(webhook))

    wait_until(announced, 45, "the announce after the kill", 0.2)
    print(f"\nannounced {time.monotonic() - killed_at:.1f}s after the kill")
    (spawn,) = cluster.spawns()
    assert spawn["announce"] == "delivered"
    assert idempotency_counts(webhook) == {f"announce:{spawn['spawnId']}": 1}
    transcript = svc.store.transcripts.all(parent)
    announces = [
        m
        for m in transcript
        if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
    ]
    assert len(announces) == 1
    busy_run = svc.store.runs.get(busy)
    assert busy_run is not None and busy_run.status == "ok" and busy_run.attempt == 2
