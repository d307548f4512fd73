"""A worker cut off from Redis for longer than its run lease, then healed, with over 200
runs in flight: every run ends once, no transcript message is lost or doubled, every
announce is delivered once, every client answer is 200 (or 503 with Retry-After) within
its timeout, and the cut-off worker's late writes are refused by the attempt fence, never
applied.

The first worker runs in a network namespace of its own, joined to the host by a veth pair
(`netns.Partition`); the private redis-server listens on the host end as well as loopback,
and the webhook standing in for the chat platform on the host end. Everything else (the
second worker, two beats, two apis and the test's clients) is on the host. The burst, made
over HTTP on both apis, mixes plain runs queued in their session lanes, runs whose model
makes a waiting send (parked runs, reply-back flows) or a spawn, and clients' own waiting
sends. Once both workers execute runs and every send and spawn has been made, the host end
of the pair goes down for several lane leases: the sweep takes the cut-off worker's runs
back and the other worker runs them again. The cut is shorter than the store client's
socket timeout, so the commands the cut-off worker sent meanwhile (its runs' ends, its
lease renewals) reach Redis after the heal, late: each must be refused.

Redis is the broker (the worker in the namespace reaches a RabbitMQ on loopback no more
than it reaches Redis, and the point here is the store's fence, not the broker's).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from faultkit import (
    CHANNEL,
    LANE_LEASE_S,
    TOKEN,
    Cluster,
    Proc,
    assert_transcripts_exact,
    count_by,
    idempotency_counts,
    wait_until,
)
from netns import Partition, SharedRedisServer, why_not, worker_in
from scalekit import (
    CLIENT_SENDS,
    CLIENT_TIMEOUT_S,
    RUN_SENDS,
    SPAWNS,
    WAITERS,
    Clients,
    events,
    fenced_writes,
    make_cluster,
    run_ends,
    runs_received_by,
    settled,
    start_burst,
    sweep_totals,
    unsettled,
)

from switchboard.shared.runtime.leases import LATE
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.scale, pytest.mark.timeout(420)]

PLAIN_SESSIONS = 50
PLAIN_QUEUED = 5  # one run holds each lane, four queue behind it (~15 s a lane)
PLAIN_SLEEPS = 3  # plain runs sleep 2 to 4 s
LONG = 6  # runs still executing on the cut-off worker when it is healed (its lease keeper
LONG_S = 50  # finds them taken over: the renewal is refused and they stop)
CUT_S = 5 * LANE_LEASE_S  # well past the lease; under the store client's 30 s socket timeout


@dataclass
class Setup:
    cluster: Cluster
    partition: Partition
    victim: Proc
    http: list[httpx.Client]
    webhook: WebhookReceiver


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    """The namespace and its pair, a redis-server and a webhook on the host end, the worker
    in the namespace, two beats and two apis (the test starts the host's worker); all
    removed after."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    partition = Partition()
    http: list[httpx.Client] = []
    cluster: Cluster | None = None
    try:
        partition.open()
        with (
            SharedRedisServer(tmp_path / "redis", partition.host_ip) as server,
            WebhookReceiver(host=partition.host_ip) as webhook,
        ):
            workdir = tmp_path / "service"
            workdir.mkdir()
            cluster = make_cluster(server.url_at("127.0.0.1"), workdir, webhook.url, None)
            inside = {"SWITCHBOARD_REDIS_URL": server.url_at(partition.host_ip)}
            victim = worker_in(cluster, partition, inside, concurrency=24, node="worker1@%h")
            for n in (1, 2):
                cluster.beat(cluster.workdir / f"beat{n}")
            for _ in (1, 2):
                _, url = cluster.api()
                auth = {"Authorization": f"Bearer {TOKEN}"}
                http.append(httpx.Client(base_url=url, headers=auth, timeout=CLIENT_TIMEOUT_S))
            yield Setup(cluster, partition, victim, http, webhook)
    finally:
        for client in http:
            client.close()
        if cluster is not None:
            cluster.stop_all()
        partition.close()
    assert not partition.exists(), f"{partition.ns} or {partition.host_if} was left behind"


@pytest.fixture
def cluster(setup: Setup) -> Cluster:
    """The setup's cluster (named so: the folder's hook attaches its logs to a failure)."""
    return setup.cluster


def test_a_worker_cut_off_past_its_lease_is_fenced_once_healed(
    setup: Setup, cluster: Cluster
) -> None:
    """Cut the first worker off for five lane leases with 200+ runs in flight, then heal:
    its runs end once (on the other worker), its late writes are refused, nothing is lost
    or doubled, every client is answered."""
    partition, victim, webhook = setup.partition, setup.victim, setup.webhook
    clients = Clients(setup.http)
    started = time.monotonic()

    # Long runs first, while the worker in the namespace is the only one: they execute
    # there, past the heal.
    long_started = time.monotonic()
    long_runs = [
        clients.start(f"agent:main:hook:long-{i}", f"/sleep {LONG_S}\nlong {i}", i % 2)
        for i in range(LONG)
    ]
    wait_until(
        lambda: {r.status for r in cluster.runs()} == {"running"},
        30,
        "the long runs to execute on the worker in the namespace",
        0.1,
    )
    survivor = cluster.worker(concurrency=24, node="worker2@%h")

    sent: list[dict[str, Any]] = []

    def client_send(i: int) -> None:
        target = f"agent:main:{CHANNEL}:group:client-target-{i}"
        result = clients.send(
            f"agent:main:hook:client-asker-{i}", target, f"/sleep 1\n/reply pong {i}", i % 2
        )
        with clients.lock:
            sent.append(result)

    senders = [threading.Thread(target=client_send, args=(i,)) for i in range(CLIENT_SENDS)]
    for thread in senders:
        thread.start()
    burst, tool_runs = start_burst(clients, PLAIN_SESSIONS, PLAIN_QUEUED, PLAIN_SLEEPS)
    acknowledged = long_runs + burst
    assert len(burst) >= 200

    def tools_done() -> bool:
        """Every model's send parked on its target, every spawning parent ended: a run cut
        off between its tool's effect and its own park or end runs again from its start
        and calls the tool again (a second send or spawn: tool side effects are
        at-least-once), which is not what this test is about."""
        found = cluster.services.store.runs.get_many(list(tool_runs))
        return all(r is not None and (r.terminal or r.status == "parked") for r in found)

    def now() -> dict[str, Any]:
        runs = cluster.runs()
        return {
            "notTerminal": sum(not r.terminal for r in runs),
            "byStatus": count_by(r.status for r in runs),
            "takenByVictim": runs_received_by(victim),
            "takenBySurvivor": runs_received_by(survivor),
        }

    def in_flight() -> dict[str, Any] | None:
        picture = now()
        busy = picture["byStatus"].get("running", 0) >= 30
        both = picture["takenByVictim"] and picture["takenBySurvivor"]
        ready = picture["notTerminal"] >= 200 and busy and both and tools_done()
        return picture if ready else None

    def in_time() -> bool:
        """The long runs will still execute once healed (with 10 s to spare)."""
        return time.monotonic() - long_started < LONG_S - CUT_S - 10

    what = "200 runs in flight, both workers running some, every send and spawn made"
    picture = wait_until(in_flight, 60, what, 0.05, now)
    assert in_time(), f"the burst took too long: {time.monotonic() - long_started:.1f}s"

    # Clients wait for every run, on both apis, through the cut and after.
    waited: dict[str, dict[str, Any]] = {}
    queue = list(acknowledged)

    def waiter() -> None:
        while True:
            with clients.lock:
                if not queue:
                    return
                run_id = queue.pop(0)
            outcome = clients.wait(run_id)
            with clients.lock:
                waited[run_id] = outcome

    threads = [threading.Thread(target=waiter) for _ in range(WAITERS)]
    for thread in threads:
        thread.start()

    partition.cut()
    cut_at = time.monotonic()
    print(f"\ncut worker1 off after {cut_at - started:.1f}s with {picture}")
    # The sweep (on the host's worker) takes the cut-off worker's runs back meanwhile.
    wait_until(
        lambda: sweep_totals([survivor]).get("requeued", 0) > 0,
        CUT_S + 30,
        "the sweep to requeue a run of the cut-off worker",
        0.2,
    )
    time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
    partition.heal()
    healed_at = time.monotonic()
    print(f"healed after {healed_at - cut_at:.1f}s (lane lease {LANE_LEASE_S}s)")

    for thread in senders + threads:
        thread.join(180)
    assert not any(t.is_alive() for t in senders + threads), "a client never got its answer"
    wait_until(
        lambda: settled(cluster), 180, "everything to settle", 0.5, lambda: unsettled(cluster)
    )
    print(
        f"settled {time.monotonic() - healed_at:.1f}s after the heal, "
        f"{time.monotonic() - started:.1f}s in all"
    )

    # The cut-off worker's late writes: refused, each by a newer attempt of its run.
    runs = cluster.runs()
    by_id = {r.run_id: r for r in runs}

    def fenced() -> list[tuple[str, int, str]]:
        return fenced_writes(victim)

    def leases_refused() -> bool:
        return {r for r, _, kind in fenced() if kind == "lease"} >= set(long_runs)

    # Its lease keeper's renewals for the long runs: refused (those sent during the cut
    # arrive late, or the next one after the heal), and the runs stop there.
    wait_until(leases_refused, 60, "the cut-off worker's lease renewals to be refused", 0.5)
    refused = fenced()
    kinds = Counter(kind for _, _, kind in refused)
    sends = fenced_writes(victim, "delivery")
    print(f"writes fenced on the cut-off worker: {len(refused)} {dict(kinds)}; ", end="")
    print(f"announce posts refused: {len(sends)}")
    assert kinds["end"] > 0, kinds  # ends sent during the cut, arriving after the heal
    stopped = {e.split()[1] for e in events(victim) if e.endswith("stopped: superseded")}
    assert stopped >= set(long_runs), stopped
    for run_id, attempt, kind in refused:
        final = by_id[run_id]
        assert final.attempt > attempt, (run_id, attempt, kind, final.attempt)
    # The survivor was never cut off: nothing of it is fenced (unless its lease keeper was
    # held up past the lease, which it logs: shown if this fails).
    late = [e for e in events(survivor) if e.startswith(LATE)]
    assert fenced_writes(survivor) == [] and fenced_writes(survivor, "delivery") == [], late
    assert victim.alive(), "the cut-off worker exited"
    totals = sweep_totals(cluster.procs)
    print(f"sweeps: {totals}")

    # Clients: every answer 200 (or 503 with Retry-After), in time, nothing broken.
    assert clients.failures == [], clients.failures
    statuses = count_by((status, retry is not None) for _, _, status, retry, _ in clients.answers)
    assert set(statuses) <= {(200, False), (200, True), (503, True)}, statuses
    slowest = max(took for *_, took in clients.answers)
    print(f"client answers: {statuses}, slowest {slowest:.1f}s")
    assert slowest < CLIENT_TIMEOUT_S

    # Every run ended ok exactly once (one applied end, on one worker), the clients saw so.
    assert set(acknowledged) <= set(by_id), "an acknowledged run was lost"
    assert set(waited) == set(acknowledged)
    assert count_by(o["status"] for o in waited.values()) == {"ok": len(acknowledged)}
    outcome = count_by((r.status, r.attempt) for r in runs)
    print(f"runs: {len(runs)}; (status, attempt): {outcome}")
    assert {r.status for r in runs} == {"ok"}, outcome
    assert any(r.attempt > 1 for r in runs), outcome  # the cut-off worker's runs ran again
    # One applied end per run, counted where the end step writes it (its run.ended event,
    # in the same script); the workers' logs name no run twice (an end applied whose
    # answer the cut dropped is in no log: the run's next claim finds it ended).
    applied = count_by(e["runId"] for e in cluster.events("run.ended"))
    assert applied == {run_id: 1 for run_id in by_id}, {
        r: applied.get(r, 0) for r in by_id if applied.get(r, 0) != 1
    }
    ends = run_ends([victim, survivor])
    assert set(ends) <= set(by_id), set(ends) - set(by_id)
    assert {k: n for k, n in ends.items() if n > 1} == {}
    # A run whose end was fenced on the cut-off worker ended on the other one.
    assert {r for r, _, kind in refused if kind == "end"} <= set(ends)

    checked = assert_transcripts_exact(cluster, runs)
    print(f"transcripts: {checked} messages checked, none missing or doubled")

    # Sends answered; every flow done, its announce delivered once; spawns' likewise.
    assert len(sent) == CLIENT_SENDS
    assert all(s["status"] in ("ok", "timeout") and s.get("flowId") for s in sent), sent
    flows = cluster.flows()
    assert len(flows) == RUN_SENDS + CLIENT_SENDS and {f["status"] for f in flows} == {"done"}
    assert count_by(f["announce"]["status"] for f in flows) == {"delivered": len(flows)}
    spawns = cluster.spawns()
    assert count_by(s.get("announce") for s in spawns) == {"delivered": SPAWNS}
    # Each delivery settled `delivered` once in the store, and reached the webhook. A
    # second POST of one is allowed only where the cut caught an attempt mid-post (the
    # request arrived, its answer did not: the delivery was attempted again, with the same
    # Idempotency-Key for the receiver to drop the copy); a post after the heal on a claim
    # another attempt had taken over is fenced (`dispatch._attempt`).
    deliveries = cluster.deliveries()
    seen = idempotency_counts(webhook)
    assert {d["idempotencyKey"] for d in deliveries} == set(seen)
    twice = {k: n for k, n in seen.items() if n > 1}
    retried = {d["idempotencyKey"] for d in deliveries if int(d.get("attempts") or 0) > 1}
    assert set(twice) <= retried and max(twice.values(), default=1) <= 2, (twice, retried)
    print(f"announces: {len(seen)} delivered; posted twice across the cut: {len(twice)}")
