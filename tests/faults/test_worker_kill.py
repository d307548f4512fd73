"""kill -9 of a worker with ~200 runs in flight: every run ends once, nothing doubled or lost.

The load mixes every kind of in-flight work: plain runs queued in their session lanes,
agent runs parked on a waiting ``sessions_send`` while their target runs, reply-back flows
between rounds, single sub-agents and ``join: "all"`` batches. The worker is killed with
SIGKILL once each kind is in flight; a new worker and beat take over. Then every run is
terminal and ``ok``, every transcript is exactly its runs' turns (no message twice, none
missing), every flow and spawn is done, and each announce reached the webhook once.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from faultkit import (
    CHANNEL,
    Cluster,
    assert_transcripts_exact,
    count_by,
    idempotency_counts,
    wait_until,
)

from switchboard.shared.delivery.records import TERMINAL_STATUSES
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard_testkit import store_reads
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.faults

PLAIN_SESSIONS = 50
PLAIN_QUEUED = 4  # runs per plain session: one holds the lane, the others queue behind it
SENDS = 20
SPAWNS = 15
BATCHES = 5
BATCH_SIZE = 3


def _start(cluster: Cluster, session_key: str, message: str) -> str:
    accepted = start_run(cluster.services, RunRequest(session_key=session_key, message=message))
    return str(accepted["runId"])


def _tool(name: str, args: dict[str, Any]) -> str:
    return f"/tool {name} {json.dumps(args)}"


def _submit(cluster: Cluster) -> dict[str, list[str]]:
    """Start the load; returns the acknowledged run ids by kind."""
    ids: dict[str, list[str]] = {"plain": [], "send": [], "spawn": [], "batch": []}
    for i in range(SENDS):
        target = f"agent:main:{CHANNEL}:group:target-{i}"
        # The target's reply is itself a directive, so round 1 sleeps too.
        message = f"/sleep 1\n/reply /sleep 2\n/reply round {i}"
        line = _tool(
            "sessions_send", {"sessionKey": target, "message": message, "timeoutSeconds": 90}
        )
        ids["send"].append(_start(cluster, f"agent:main:hook:asker-{i}", line))
    for i in range(SPAWNS):
        line = _tool("sessions_spawn", {"task": f"child {i}\n/sleep 3"})
        ids["spawn"].append(_start(cluster, f"agent:main:{CHANNEL}:group:parent-{i}", line))
    for i in range(BATCHES):
        tasks = [{"task": f"member {i}.{j}\n/sleep {2 + j}"} for j in range(BATCH_SIZE)]
        line = _tool("sessions_spawn", {"tasks": tasks, "join": "all"})
        ids["batch"].append(_start(cluster, f"agent:main:{CHANNEL}:group:batcher-{i}", line))
    for i in range(PLAIN_SESSIONS):
        for j in range(PLAIN_QUEUED):
            message = f"/sleep {2 + (i + j) % 3}\nplain {i}.{j}"
            ids["plain"].append(_start(cluster, f"agent:main:hook:plain-{i}", message))
    return ids


def _picture(cluster: Cluster) -> dict[str, Any]:
    """What is in flight: runs by status, flows between rounds, sub-agents running."""
    runs = cluster.runs()
    return {
        "runs": len(runs),
        "notTerminal": sum(not r.terminal for r in runs),
        "byStatus": count_by(r.status for r in runs),
        "flowsMidRound": sum(f["status"] == "running" and f["turn"] >= 1 for f in cluster.flows()),
        "childrenRunning": sum(
            r.kind == "subagent" and r.status in ("queued", "running") for r in runs
        ),
    }


def _ready_to_kill(picture: dict[str, Any]) -> dict[str, Any] | None:
    """The picture once 200 runs are in flight, some parked, with flows mid-round and
    sub-agents running."""
    ready = (
        picture["notTerminal"] >= 200
        and picture["byStatus"].get("parked", 0)
        and picture["flowsMidRound"]
        and picture["childrenRunning"]
    )
    return picture if ready else None


def _all_settled(cluster: Cluster, webhook: WebhookReceiver, expected_keys: int) -> bool:
    runs = cluster.runs()
    if any(not r.terminal for r in runs):
        return False
    if any(f["status"] != "done" for f in cluster.flows()):
        return False
    if any(s.get("status") != "done" for s in cluster.spawns()):
        return False
    deliveries = cluster.deliveries()
    if any(d["status"] not in TERMINAL_STATUSES for d in deliveries):
        return False
    if any(d["status"] != "delivered" for d in deliveries):
        return True  # settled, wrongly: the assertions below say how
    return len(idempotency_counts(webhook)) >= expected_keys


def _unsettled(cluster: Cluster, webhook: WebhookReceiver) -> dict[str, Any]:
    """What keeps the cluster from settling, for the timeout message."""
    return {
        "runs": {
            r.run_id: (r.session_key, r.status, r.attempt) for r in cluster.runs() if not r.terminal
        },
        "flows": [f for f in cluster.flows() if f["status"] != "done"],
        "spawns": [s for s in cluster.spawns() if s.get("status") != "done"],
        "deliveries": [d for d in cluster.deliveries() if d["status"] not in TERMINAL_STATUSES],
        "webhookKeys": len(idempotency_counts(webhook)),
    }


def test_kill_9_with_200_runs_in_flight_loses_and_doubles_nothing(
    cluster: Cluster, webhook: WebhookReceiver
) -> None:
    """SIGKILL mid-load; a new worker and beat finish everything exactly once."""
    first = cluster.worker(concurrency=32)
    started = time.monotonic()
    ids = _submit(cluster)
    last: list[Any] = []

    def in_flight() -> dict[str, Any] | None:
        last[:] = [_picture(cluster)]
        return _ready_to_kill(last[0])

    picture = wait_until(in_flight, 60, "every kind of work in flight", 0.05, lambda: last)
    cluster.kill(first)
    killed_at = time.monotonic()
    print(f"\nkilled after {killed_at - started:.1f}s with {picture}")

    cluster.worker(concurrency=32)
    cluster.beat()
    expected_keys = SENDS + SPAWNS + BATCHES
    wait_until(
        lambda: _all_settled(cluster, webhook, expected_keys),
        150,
        "everything to settle",
        0.5,
        lambda: _unsettled(cluster, webhook),
    )
    print(f"recovered {time.monotonic() - killed_at:.1f}s after the kill")

    runs = cluster.runs()
    acknowledged = {run_id for kind in ids.values() for run_id in kind}
    assert acknowledged <= {r.run_id for r in runs}
    outcome = count_by((r.status, r.attempt) for r in runs)
    print(f"runs: {len(runs)}; (status, attempt): {outcome}")
    assert {r.status for r in runs} == {"ok"}, outcome
    # A run re-executed after the kill has attempt 2; a parked one is resumed once more.
    assert max(r.attempt for r in runs) <= 3, outcome
    assert any(r.attempt > 1 for r in runs if r.kind != "subagent" and not r.parked), outcome

    checked = assert_transcripts_exact(cluster, runs)
    print(f"transcripts: {checked} messages checked")

    flows = cluster.flows()
    assert len(flows) == SENDS
    assert count_by(f["stopReason"] for f in flows) == {"max_turns": SENDS}
    assert all(len(f["rounds"]) == 3 for f in flows), [f["rounds"] for f in flows]
    assert count_by(f["announce"]["status"] for f in flows) == {"delivered": SENDS}
    spawns = cluster.spawns()
    assert len(spawns) == SPAWNS + BATCHES * BATCH_SIZE
    assert count_by(s.get("announce") for s in spawns) == {
        "delivered": SPAWNS,
        "batched": BATCHES * BATCH_SIZE,
    }
    assert count_by(b.get("announce") for b in cluster.batches()) == {"delivered": BATCHES}

    deliveries = cluster.deliveries()
    assert count_by(d["status"] for d in deliveries) == {"delivered": expected_keys}
    seen = idempotency_counts(webhook)
    doubled = {key: n for key, n in seen.items() if n > 1}
    print(f"webhook: {len(seen)} keys, {sum(seen.values())} deliveries, doubled {doubled}")
    assert set(seen) == {d["idempotencyKey"] for d in deliveries}
    assert doubled == {}
    assert store_reads.index_members(cluster.services.store, "deliveries_due") == []
