"""Two `switchboard api`, two `switchboard worker` and two `switchboard beat` processes,
started separately on one Redis, are one service: a wait answers on the api it started on
whichever worker ran the run, another api re-attaches to it by run id, a reply-back flow
and a spawn's announce complete across workers, and two beats recover a lost run once.

Each test runs six times: with Redis as the broker, then RabbitMQ (a vhost of its own;
skipped where RabbitMQ is not installed), each with the state on the private Redis, on a
private 3-primary Redis Cluster (`redis+cluster://`) and on a private Sentinel group of a
primary, one replica and three sentinels (`redis+sentinel://`); with either group the
broker stays on the private Redis or RabbitMQ. Workers run 2 runs at a time, so a burst
spreads over both.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from faultkit import CHANNEL, assert_transcripts_exact, count_by, wait_until
from scalekit import Service, sweep_totals

from switchboard.shared.delivery.records import TERMINAL_STATUSES
from switchboard.shared.store.runs import now_ms

pytestmark = [
    pytest.mark.scale,
    pytest.mark.timeout(240),
    # Each broker with the state on one Redis, a 3-primary Redis Cluster, a Sentinel group.
    pytest.mark.parametrize(
        "state", ["redis", "redis-cluster", "redis-sentinel"], indirect=True, scope="module"
    ),
]

# Reply-back flows started at once: enough that some flow's rounds hop between workers.
FLOWS = 10


def _both_workers(service: Service, run_ids: set[str]) -> dict[str, int]:
    """How many of `run_ids` each worker ended (every one ended by exactly one). A wait
    may answer a moment before its worker's log line is written: read until all are in."""
    wait_until(
        lambda: run_ids <= set(service.ran_on()),
        10,
        "every run's end in a worker's log",
        0.1,
        lambda: run_ids - set(service.ran_on()),
    )
    ran_on = service.ran_on()
    return count_by(ran_on[r] for r in run_ids)


def test_a_waiting_send_answers_on_its_api_whichever_worker_ran_it(service: Service) -> None:
    """Six waiting sends on api A at once: each send's HTTP request on api A answers with
    its own target's reply, whichever worker ran it. Runs enqueued together may share one
    message (one worker), so rounds go on until both workers have run some (at most 5)."""
    spread: dict[str, int] = {}
    for round_ in range(5):
        targets = [f"agent:main:hook:wait-target-{round_}-{i}" for i in range(6)]

        def send(i: int, targets: list[str] = targets, round_: int = round_) -> Any:
            return service.tool(
                0,
                f"agent:main:hook:wait-asker-{round_}-{i}",
                "sessions_send",
                sessionKey=targets[i],
                message=f"/sleep 1\n/reply pong {i}",
                timeoutSeconds=60,
            )

        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(send, range(6)))
        assert [r["status"] for r in results] == ["ok"] * 6, results
        assert [r["reply"] for r in results] == [f"pong {i}" for i in range(6)]
        for worker, count in _both_workers(service, {r["runId"] for r in results}).items():
            spread[worker] = spread.get(worker, 0) + count
        if set(spread) == {"worker1", "worker2"}:
            break
    print(f"\nwaited-on runs by worker: {spread}")
    assert set(spread) == {"worker1", "worker2"}, spread


def test_b_a_wait_reattaches_on_the_other_api_by_run_id(service: Service) -> None:
    """A send on api A that times out waiting, then `agent.wait` by its runId on api B
    answers the run's outcome; a plain run's wait too."""
    sent = service.tool(
        0,
        "agent:main:hook:reattach-asker",
        "sessions_send",
        sessionKey="agent:main:hook:reattach-target",
        message="/sleep 3\n/reply late answer",
        timeoutSeconds=1,
    )
    assert sent["status"] == "timeout", sent
    outcome = service.rpc(1, "agent.wait", runId=sent["runId"], timeoutMs=60_000)
    assert outcome["status"] == "ok" and outcome["reply"] == "late answer", outcome

    started = service.rpc(1, "agent", sessionKey="agent:main:hook:reattach-plain", message="x")
    assert started["status"] == "accepted", started
    first = service.rpc(1, "agent.wait", runId=started["runId"], timeoutMs=60_000)
    again = service.rpc(0, "agent.wait", runId=started["runId"], timeoutMs=1_000)
    assert first["status"] == again["status"] == "ok", (first, again)


def test_c_reply_back_flows_complete_with_steps_on_both_workers(service: Service) -> None:
    """Sends with reply-back (five ping-pong turns, then the announce) from both apis: every
    flow ends `max_turns` with its announce delivered, the flows' runs ran on both workers
    (on the plain path a flow's rounds hop between them), and every transcript is exact."""
    flows = []
    for i in range(FLOWS):
        result = service.tool(
            i % 2,
            f"agent:main:hook:flow-asker-{i}",
            "sessions_send",
            sessionKey=f"agent:main:{CHANNEL}:group:flow-target-{i}",
            message=f"/sleep 0.2\n/reply round {i}",
            timeoutSeconds=0,
        )
        assert result["status"] == "accepted", result
        flows.append(result["flowId"])
    cluster = service.cluster

    def done() -> bool:
        found = [f for f in cluster.flows() if f["flowId"] in flows]
        return len(found) == len(flows) and all(f["status"] == "done" for f in found)

    wait_until(done, 120, "the reply-back flows to end", 0.3, lambda: cluster.flows())
    mine = [f for f in cluster.flows() if f["flowId"] in flows]
    assert count_by(f["stopReason"] for f in mine) == {"max_turns": len(flows)}, mine
    assert all(len(f["rounds"]) == 6 for f in mine), [f["rounds"] for f in mine]

    sessions = {f"agent:main:hook:flow-asker-{i}" for i in range(FLOWS)}
    sessions |= {f"agent:main:{CHANNEL}:group:flow-target-{i}" for i in range(FLOWS)}
    runs = [r for r in cluster.runs() if r.session_key in sessions]
    wait_until(lambda: all(r.terminal for r in cluster.runs()), 60, "every run to end")
    runs = [r for r in cluster.runs() if r.session_key in sessions]
    assert {r.status for r in runs} == {"ok"}, count_by((r.session_key, r.status) for r in runs)
    spread = _both_workers(service, {r.run_id for r in runs})
    ran_on = service.ran_on()
    hops = sum(
        len({ran_on[r.run_id] for r in runs if r.session_key.endswith(f"-{i}")}) > 1
        for i in range(FLOWS)
    )
    print(f"\nflow runs by worker: {spread}; flows whose runs ran on both workers: {hops}")
    assert set(spread) == {"worker1", "worker2"}, spread
    # (A round's follow-up runs in the task of the run before it, so a flow's rounds tend
    # to stay on the worker that took its first message: no spread of rounds is asserted.)
    assert_transcripts_exact(cluster, runs)


def test_d_a_spawns_announce_arrives_whichever_worker_runs_the_child(
    service: Service,
) -> None:
    """Spawns from both apis: children run on both workers, and each announce lands once in
    its requester's transcript, its delivery settled `delivered`. Children enqueued
    together may share one message (one worker), so rounds go on until both workers have
    run some (at most 5)."""
    spread: dict[str, int] = {}
    for round_ in range(5):
        for worker, count in _spawn_round(service, round_).items():
            spread[worker] = spread.get(worker, 0) + count
        if set(spread) == {"worker1", "worker2"}:
            break
    print(f"\nchildren by worker: {spread}")
    assert set(spread) == {"worker1", "worker2"}, spread


def _spawn_round(service: Service, round_: int) -> dict[str, int]:
    """Six spawns from fresh requesters, alternating apis; every announce checked; which
    worker ran each child."""
    requesters = [f"agent:main:{CHANNEL}:group:spawner-{round_}-{i}" for i in range(6)]
    spawned = [
        service.tool(
            i % 2, key, "sessions_spawn", task=f"child {i}\n/sleep 1\n/reply child {i} done"
        )
        for i, key in enumerate(requesters)
    ]
    assert all(s["status"] == "accepted" for s in spawned), spawned
    cluster = service.cluster

    def announced() -> bool:
        mine = [s for s in cluster.spawns() if s.get("requesterKey") in requesters]
        return len(mine) == len(requesters) and all(s.get("status") == "done" for s in mine)

    wait_until(announced, 90, "every spawn to announce", 0.3, lambda: cluster.spawns())
    mine = [s for s in cluster.spawns() if s.get("requesterKey") in requesters]
    assert count_by(s.get("announce") for s in mine) == {"delivered": len(requesters)}, mine
    for i, key in enumerate(requesters):
        texts = [str(m["content"]) for m in cluster.services.store.transcripts.all(key)]
        assert sum(f"{i} done" in t for t in texts) == 1, (key, texts)

    def settled() -> dict[str, str]:
        found = {d["deliveryId"]: d["status"] for d in cluster.deliveries()}
        statuses = {s["spawnId"]: found.get(s["deliveryId"], "") for s in mine}
        return statuses if set(statuses.values()) <= TERMINAL_STATUSES else {}

    statuses = wait_until(settled, 30, "the announces' deliveries to settle", 0.2)
    assert set(statuses.values()) == {"delivered"}, statuses
    return _both_workers(service, {s["runId"] for s in mine})


def test_e_two_beats_requeue_a_lost_run_once_and_archive_once(service: Service) -> None:
    """With two beats (each scheduling the sweep every 0.5 s) and a worker killed with its
    runs: each lost run is requeued once (attempt 2, one `requeued` in all the sweeps'
    logs), every run ends once, and sub-agent sessions due for archive are archived once."""
    cluster = service.cluster
    keys = [f"agent:main:hook:lost-{i}" for i in range(4)]
    started = [
        service.rpc(i % 2, "agent", sessionKey=k, message=f"/sleep 4\nlost {i}")
        for i, k in enumerate(keys)
    ]
    ids = [s["runId"] for s in started]

    def all_running() -> bool:
        found = cluster.services.store.runs.get_many(ids)
        return all(r is not None and r.status == "running" for r in found)

    wait_until(all_running, 30, "4 runs running on the 2 workers")
    before = sweep_totals(service.workers)
    victim = service.workers[0]
    cluster.kill(victim)
    wait_until(
        lambda: all(
            r is not None and r.terminal for r in cluster.services.store.runs.get_many(ids)
        ),
        90,
        "every run to end",
        0.3,
    )
    runs = [r for r in cluster.services.store.runs.get_many(ids) if r is not None]
    assert {r.status for r in runs} == {"ok"}, runs
    attempts = count_by(r.attempt for r in runs)
    print(f"\nattempts: {attempts}")
    lost = attempts.get(2, 0)
    assert lost >= 1 and set(attempts) <= {1, 2}, attempts
    time.sleep(2)  # a few more sweeps from both beats: none may requeue again
    after = sweep_totals(service.workers)
    assert after.get("requeued", 0) - before.get("requeued", 0) == lost, (before, after)
    assert_transcripts_exact(cluster, runs)

    # A replacement worker; then sub-agent sessions whose archive time has come (as
    # `archiveAfterMinutes` after their announce): the sweeps archive each once.
    service.workers[0] = cluster.worker(concurrency=2, node="worker3@%h")
    requesters = [f"agent:main:hook:archiver-{i}" for i in range(4)]
    for i, key in enumerate(requesters):
        spawned = service.tool(i % 2, key, "sessions_spawn", task=f"archived {i}")
        assert spawned["status"] == "accepted", spawned

    def children() -> list[dict[str, Any]]:
        mine = [s for s in cluster.spawns() if s.get("requesterKey") in requesters]
        done = len(mine) == len(requesters) and all(s.get("status") == "done" for s in mine)
        return mine if done else []

    spawns = wait_until(children, 60, "the children to announce", 0.3)
    for spawn in spawns:  # archiveAfterMinutes (60) passed: their archive is due now
        assert cluster.services.store.spawns.archive_at(spawn["childKey"]), spawn
        cluster.services.store.spawns.postpone_archive(spawn["childKey"], now_ms())
    exports = cluster.workdir / "data" / "sessions"

    def archived() -> bool:
        gone = not any(cluster.services.store.sessions.exists(s["childKey"]) for s in spawns)
        return gone and len(list(exports.glob("*.jsonl"))) >= len(spawns)

    wait_until(archived, 60, "every child session to be archived", 0.3)
    time.sleep(2)
    totals = sweep_totals([*service.workers, victim])
    print(f"sweeps: {totals}")
    assert totals.get("archived", 0) == len(spawns), totals
    assert sorted(p.stem for p in exports.glob("*.jsonl")) == sorted(s["sessionId"] for s in spawns)
