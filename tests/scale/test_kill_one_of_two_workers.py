"""kill -9 of one of two workers with over 200 runs in flight: the other worker and the
sweep finish everything; every run ends once, no transcript message is lost or doubled.

Run with Redis, then RabbitMQ, as the broker. The burst mixes plain runs queued in their
session lanes, waiting sends (parked runs, reply-back flows) and sub-agent spawns; the first
worker is killed once both workers have runs executing and every send and spawn has been
made. Nothing is restarted: the surviving worker, two apis and two beats are the service
from then on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
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
from scalekit import (
    BROKERS,
    broker_for,
    make_cluster,
    runs_ended_by,
    runs_received_by,
    settled,
    tool_line,
    unsettled,
)

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.scale, pytest.mark.timeout(420)]

PLAIN_SESSIONS = 50
PLAIN_QUEUED = 4  # one run holds each lane, three queue behind it
SENDS = 10
SPAWNS = 10


@pytest.fixture(params=BROKERS)
def cluster(
    request: pytest.FixtureRequest, redis_url: str, tmp_path: Path, webhook: WebhookReceiver
) -> Iterator[Cluster]:
    """A cluster on the test's private Redis with the broker of the parameter."""
    with broker_for(request.param) as broker:
        made = make_cluster(redis_url, tmp_path, webhook.url, broker)
        try:
            yield made
        finally:
            made.stop_all()


def _start(cluster: Cluster, session_key: str, message: str) -> str:
    accepted = start_run(cluster.services, RunRequest(session_key=session_key, message=message))
    return str(accepted["runId"])


def _submit(cluster: Cluster) -> list[str]:
    """The burst; returns the acknowledged run ids."""
    ids = []
    for i in range(SENDS):
        line = tool_line(
            "sessions_send",
            {
                "sessionKey": f"agent:main:{CHANNEL}:group:target-{i}",
                "message": f"/sleep 2\n/reply round {i}",
                "timeoutSeconds": 120,
            },
        )
        ids.append(_start(cluster, f"agent:main:hook:asker-{i}", line))
    for i in range(SPAWNS):
        line = tool_line("sessions_spawn", {"task": f"child {i}\n/sleep 2\n/reply child {i}"})
        ids.append(_start(cluster, f"agent:main:{CHANNEL}:group:parent-{i}", line))
    for i in range(PLAIN_SESSIONS):
        for j in range(PLAIN_QUEUED):
            message = f"/sleep {2 + (i + j) % 3}\nplain {i}.{j}"
            ids.append(_start(cluster, f"agent:main:hook:plain-{i}", message))
    return ids


def test_kill_9_of_one_of_two_workers_under_a_burst(
    cluster: Cluster, webhook: WebhookReceiver
) -> None:
    """SIGKILL one of two workers with 200+ runs in flight; everything ends exactly once."""
    victim = cluster.worker(concurrency=24, node="worker1@%h")
    survivor = cluster.worker(concurrency=24, node="worker2@%h")
    for n in (1, 2):
        cluster.beat(cluster.workdir / f"beat{n}")
    started = time.monotonic()
    acknowledged = _submit(cluster)
    assert len(acknowledged) >= 200

    def now() -> dict[str, Any]:
        runs = cluster.runs()
        return {
            "notTerminal": sum(not r.terminal for r in runs),
            "byStatus": count_by(r.status for r in runs),
            "takenByVictim": runs_received_by(victim),
            "takenBySurvivor": runs_received_by(survivor),
        }

    senders = set(acknowledged[: SENDS + SPAWNS])

    def tools_done() -> bool:
        """Every send parked on its target, every spawning parent ended: a run killed
        between its tool's effect and its own park or end is run again from its start,
        and its model calls the tool again (a second send or spawn), which is not what
        this test is about."""
        found = cluster.services.store.runs.get_many(list(senders))
        return all(r is not None and (r.terminal or r.status == "parked") for r in found)

    def in_flight() -> dict[str, Any] | None:
        picture = now()
        busy = picture["byStatus"].get("running", 0) >= 30
        both = picture["takenByVictim"] and picture["takenBySurvivor"]
        ready = picture["notTerminal"] >= 200 and busy and both and tools_done()
        return picture if ready else None

    what = "200 runs in flight, both workers running some, every send and spawn made"
    picture = wait_until(in_flight, 60, what, 0.05, now)
    cluster.kill(victim)
    killed_at = time.monotonic()
    print(f"\nkilled worker1 after {killed_at - started:.1f}s with {picture}")

    wait_until(
        lambda: settled(cluster), 240, "everything to settle", 0.5, lambda: unsettled(cluster)
    )
    print(f"settled {time.monotonic() - killed_at:.1f}s after the kill")

    runs = cluster.runs()
    assert set(acknowledged) <= {r.run_id for r in runs}, "an acknowledged run was lost"
    outcome = count_by((r.status, r.attempt) for r in runs)
    print(f"runs: {len(runs)}; (status, attempt): {outcome}")
    assert {r.status for r in runs} == {"ok"}, outcome
    assert any(r.attempt > 1 for r in runs), outcome  # the victim's runs ran again

    # No run ended on both workers (one ended on the victim is not run again).
    by_victim, by_survivor = runs_ended_by(victim), runs_ended_by(survivor)
    assert by_victim & by_survivor == set(), by_victim & by_survivor
    print(f"ended by worker1 before the kill: {len(by_victim)}, by worker2: {len(by_survivor)}")

    checked = assert_transcripts_exact(cluster, runs)
    print(f"transcripts: {checked} messages checked, none missing or doubled")

    flows = cluster.flows()
    assert len(flows) == SENDS and {f["status"] for f in flows} == {"done"}
    assert count_by(f["announce"]["status"] for f in flows) == {"delivered": SENDS}
    spawns = cluster.spawns()
    assert count_by(s.get("announce") for s in spawns) == {"delivered": SPAWNS}
    seen = idempotency_counts(webhook)
    assert {d["idempotencyKey"] for d in cluster.deliveries()} == set(seen)
    assert {k: n for k, n in seen.items() if n > 1} == {}
