"""Beat stopped for a while: the work only the sweep resolves piles up, then is caught up.

While beat is down: a run whose worker was killed past its deadline stays ``running``
with an expired lane lease, a run parked on a wait whose deadline passed stays parked,
sub-agent sessions due for archival stay, and a delivery retry that is due is not sent.
When beat returns, one sweep after another resolves all of it.
"""

from __future__ import annotations

import json
import time

import pytest
from faultkit import CHANNEL, Cluster, count_by, wait_until

from switchboard.shared.delivery import Target, enqueue_delivery, get_delivery
from switchboard.shared.flows.subagent_archive import transcript_path
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.store.runs import ParkedCall, RunRecord, now_ms
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.faults

GHOSTS = 4
PARKED = 4
CHILDREN = 3


def test_sweeps_catch_up_after_beat_was_stopped(cluster: Cluster, webhook: WebhookReceiver) -> None:
    """Everything that waited for the sweep is resolved once beat runs again."""
    svc = cluster.services
    beat = cluster.beat()
    booted = time.monotonic()
    first = cluster.worker(concurrency=16)
    # Ghost runs outlive the start of a second worker (however slow this machine is today).
    ghost_timeout_s = round(3 * (time.monotonic() - booted) + 5)
    spawner = f"agent:main:{CHANNEL}:group:spawner"
    line = "/tool sessions_spawn " + json.dumps(
        {"tasks": [{"task": f"child {i}"} for i in range(CHILDREN)], "join": "each"}
    )
    start_run(svc, RunRequest(session_key=spawner, message=line))
    wait_until(
        lambda: [s.get("status") for s in cluster.spawns()] == ["done"] * CHILDREN,
        30,
        "the children to finish",
    )
    cluster.stop(beat)

    ghosts = [
        start_run(
            svc,
            RunRequest(
                session_key=f"agent:main:hook:ghost-{i}",
                message="/sleep 60\nghost",
                timeout_s=ghost_timeout_s,
            ),
        )["runId"]
        for i in range(GHOSTS)
    ]
    wait_until(
        lambda: all((r := svc.store.runs.get(g)) and r.status == "running" for g in ghosts),
        20,
        "the ghost runs to start",
    )
    second = cluster.worker(concurrency=16)  # its startup sweep runs before the kill
    cluster.kill(first)
    del second
    waits = []
    for i in range(PARKED):
        args = {
            "sessionKey": f"agent:main:hook:slow-{i}",
            "message": f"/sleep {ghost_timeout_s + 40}\nslow",
            "timeoutSeconds": 2,
        }
        msg = "/tool sessions_send " + json.dumps(args)
        waits.append(
            start_run(svc, RunRequest(session_key=f"agent:main:hook:waiter-{i}", message=msg))[
                "runId"
            ]
        )
    webhook.respond(500)
    delivery_id = enqueue_delivery(
        svc,
        target=Target(channel=CHANNEL, to="group:late"),
        message="late",
        session_key=f"agent:main:{CHANNEL}:group:late",
        idempotency_key="late-delivery",
        origin={"kind": "test"},
    )
    children = [str(s["childKey"]) for s in cluster.spawns()]
    records = svc.store.spawns
    for child in children:  # as if archiveAfterMinutes had passed
        svc.store.redis.zadd(svc.store.ks.beside(child).archive_due, {child: now_ms()}, xx=True)

    def piled_up() -> bool:
        now = now_ms()
        runs = svc.store.runs.get_many(ghosts + waits)
        delivery = get_delivery(svc, delivery_id)
        return (
            all(
                r is not None and r.status == "running" and (r.deadline_at_ms or 0) < now
                for r in runs[:GHOSTS]
            )
            and all(r is not None and r.status == "parked" for r in runs[GHOSTS:])
            and max(_wait_deadline(r) for r in runs[GHOSTS:]) < now
            and delivery is not None
            and delivery["status"] == "pending"
            and delivery["attempts"] == 1
            and delivery["nextAttemptAt"] < now
        )

    def state() -> object:
        runs = svc.store.runs.get_many(ghosts + waits)
        return [(r.status, r.attempt) for r in runs if r], get_delivery(svc, delivery_id)

    wait_until(piled_up, ghost_timeout_s + 20, "the work to pile up without beat", 0.2, state)
    time.sleep(2)  # and nothing moves while beat is down
    assert piled_up()
    leases = svc.store.runs.expired_leases(now_ms())
    assert {f"agent:main:hook:ghost-{i}" for i in range(GHOSTS)} <= set(leases)
    assert set(records.due_archives(now_ms())) == set(children)

    cluster.beat()
    back = time.monotonic()

    def caught_up() -> bool:
        runs = svc.store.runs.get_many(ghosts + waits)
        delivery = get_delivery(svc, delivery_id)
        return (
            all(r is not None and r.terminal for r in runs)
            and not records.due_archives(now_ms() + 1)
            and delivery is not None
            and delivery["status"] == "delivered"
        )

    wait_until(caught_up, 60, "the sweeps to catch up", 0.2)
    print(f"\ncaught up {time.monotonic() - back:.1f}s after beat came back")
    runs = svc.store.runs.get_many(ghosts + waits)
    assert count_by((r.status, r.attempt) for r in runs[:GHOSTS] if r) == {("timeout", 2): GHOSTS}
    for rec in runs[GHOSTS:]:
        assert rec is not None and rec.status == "ok"
        assert json.loads(rec.reply or "{}")["status"] == "timeout"
    for child in children:
        assert not svc.store.sessions.exists(child)
    assert len(list(transcript_path(svc, "x").parent.glob("*.jsonl"))) == CHILDREN
    assert get_delivery(svc, delivery_id)["attempts"] == 2  # type: ignore[index]


def _wait_deadline(rec: RunRecord | None) -> int:
    """When the wait a parked run parks on times out (ms)."""
    assert rec is not None and rec.parked
    return ParkedCall.from_json(rec.parked[0]).deadline_ms
