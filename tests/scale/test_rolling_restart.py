"""A rolling restart of every api and worker, one at a time, with over 200 runs in flight:
every run ends once, no transcript message is lost or doubled, every announce is delivered
once, and every client request answers 200 (or 503 with Retry-After) within its timeout.

Run with Redis, then RabbitMQ, as the broker. The burst, made over HTTP on both apis, mixes
plain runs queued in their session lanes, runs whose model makes a waiting send (parked
runs, reply-back flows) or a spawn, and clients' own waiting sends (reply-back flows); a
trickle of new runs goes on during the restarts, so each worker has runs to hand back.
Clients wait for every run by `agent.wait` with short waits, each on an api that is up: an
api being restarted gets no new request (as behind a load balancer), finishes the ones it
holds on SIGTERM and comes back on the same port; a worker stopped by SIGTERM hands its runs
back and comes back under the same node name. The next process restarts once the last
one's replacement is healthy.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultkit import (
    CHANNEL,
    assert_transcripts_exact,
    count_by,
    idempotency_counts,
    wait_until,
)
from scalekit import (
    BROKERS,
    CLIENT_SENDS,
    CLIENT_TIMEOUT_S,
    RUN_SENDS,
    SPAWNS,
    WAITERS,
    Clients,
    Service,
    broker_for,
    make_cluster,
    run_ends,
    runs_handed_back,
    settled,
    start_burst,
    unsettled,
)

from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.scale, pytest.mark.timeout(300)]

PLAIN_SESSIONS = 30
# One run holds each lane, eight queue behind it (~31 s a lane): the lanes end about 8.5
# runs a second, so 270 plain runs keep 200 in flight for ~12 s after the burst, room
# for the sends and spawns to be made on a loaded host (six a lane left ~3 s).
PLAIN_QUEUED = 9
PLAIN_SLEEPS = 4  # plain runs sleep 2 to 5 s
TRICKLE_EVERY_S = 0.25  # a new plain run while the restarts go on


@pytest.fixture(params=BROKERS)
def service(
    request: pytest.FixtureRequest, redis_url: str, tmp_path: Path, webhook: WebhookReceiver
) -> Iterator[Service]:
    """Two apis, two workers and two beats on the test's private Redis, with the broker of
    the parameter."""
    with broker_for(request.param) as broker:
        cluster = make_cluster(redis_url, tmp_path, webhook.url, broker)
        made = None
        try:
            made = Service(cluster, concurrency=8)
            yield made
        finally:
            if made is not None:
                made.close()
            cluster.stop_all()


def test_a_rolling_restart_of_every_api_and_worker_under_a_burst(
    service: Service, webhook: WebhookReceiver
) -> None:
    """worker 1, api 1, worker 2, api 2 restarted in turn (SIGTERM, then a replacement)
    with 200+ runs in flight: every run ends ok once, transcripts exact, announces once,
    every client answer 200 in time."""
    cluster = service.cluster
    clients = Clients(service.http)
    started = time.monotonic()

    # Clients' waiting sends, on both apis, each holding its request up to SEND_WAIT_S.
    sent: list[dict[str, Any]] = []

    def client_send(i: int) -> None:
        target = f"agent:main:{CHANNEL}:group:client-target-{i}"
        result = clients.send(
            f"agent:main:hook:client-asker-{i}", target, f"/reply pong {i}", i % 2
        )
        with clients.lock:
            sent.append(result)

    senders = [threading.Thread(target=client_send, args=(i,)) for i in range(CLIENT_SENDS)]
    for thread in senders:
        thread.start()
    acknowledged, tool_runs = start_burst(clients, PLAIN_SESSIONS, PLAIN_QUEUED, PLAIN_SLEEPS)
    assert len(acknowledged) >= 200

    def tools_done() -> bool:
        """Every model's send parked on its target, every spawning parent ended: a run
        stopped between its tool's effect and its own park or end runs again from its
        start and calls the tool again (a second send or spawn), which is not what this
        test is about (as in the kill test)."""
        found = cluster.services.store.runs.get_many(list(tool_runs))
        return all(r is not None and (r.terminal or r.status == "parked") for r in found)

    def picture() -> dict[str, Any]:
        runs = cluster.runs()
        found: dict[str, Any] = {"notTerminal": sum(not r.terminal for r in runs)}
        found["byStatus"] = count_by(r.status for r in runs)
        found["toolsDone"] = tools_done()
        return found

    def in_flight() -> dict[str, Any] | None:
        now = picture()
        return now if now["notTerminal"] >= 200 and now["toolsDone"] else None

    burst = wait_until(
        in_flight, 60, "200 runs in flight, every send and spawn made", 0.05, state=picture
    )
    print(f"\nburst of {len(acknowledged)} runs in {time.monotonic() - started:.1f}s: {burst}")

    # Clients wait for every run; a trickle of new runs goes on until the restarts end.
    waited: dict[str, dict[str, Any]] = {}
    queue = list(acknowledged)
    restarting = threading.Event()
    restarting.set()
    trickle_done = threading.Event()
    trickled: list[str] = []

    def waiter() -> None:
        while True:
            with clients.lock:
                if not queue:
                    if trickle_done.is_set():
                        return
                    run_id = None
                else:
                    run_id = queue.pop(0)
            if run_id is None:
                time.sleep(0.1)
                continue
            outcome = clients.wait(run_id)
            with clients.lock:
                waited[run_id] = outcome

    def trickle() -> None:
        n = 0
        while restarting.is_set():
            run_id = clients.start(f"agent:main:hook:live-{n}", f"/sleep 2\nlive {n}")
            n += 1
            with clients.lock:
                trickled.append(run_id)
                queue.append(run_id)
            time.sleep(TRICKLE_EVERY_S)
        trickle_done.set()

    threads = [threading.Thread(target=waiter) for _ in range(WAITERS)]
    threads.append(threading.Thread(target=trickle))
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the trickle's runs reach both workers

    restarts: list[dict[str, Any]] = []
    try:
        for kind, index in (("worker", 0), ("api", 0), ("worker", 1), ("api", 1)):
            began = time.monotonic()
            done: dict[str, Any] = {
                "process": f"{kind}{index + 1}",
                "notTerminal": sum(not r.terminal for r in cluster.runs()),
            }
            if kind == "api":
                clients.up[index] = False  # the load balancer sends it nothing new
                time.sleep(0.5)
                old = service.apis[index]
                done["requestsHeld"] = clients.open[index]  # it finishes them as it stops
                service.restart_api(index)
                clients.up[index] = True
                # uvicorn ends its graceful shutdown raising the signal it got again
                done["drained"] = "Finished server process" in old.output()
            else:
                old = service.workers[index]
                service.restart_worker(index)
                done["handedBack"] = runs_handed_back(old)
            done["exit"] = old.popen.returncode
            done["took_s"] = round(time.monotonic() - began, 1)
            restarts.append(done)
            print(f"restarted {restarts[-1]}")
    finally:
        restarting.clear()
    restarted_at = time.monotonic()
    for thread in senders + threads:
        thread.join(120)
    assert not any(t.is_alive() for t in senders + threads), "a client never got its answer"
    print(f"clients done {time.monotonic() - restarted_at:.1f}s after the last restart")

    wait_until(
        lambda: settled(cluster), 120, "everything to settle", 0.5, lambda: unsettled(cluster)
    )
    print(
        f"settled {time.monotonic() - restarted_at:.1f}s after the last restart, "
        f"{time.monotonic() - started:.1f}s in all"
    )

    # Every process stopped gracefully within its grace: each api drained its requests,
    # each worker handed runs back and exited 0.
    apis = [r for r in restarts if r["process"].startswith("api")]
    workers = [r for r in restarts if r["process"].startswith("worker")]
    assert all(r["drained"] and r["exit"] in (0, -signal.SIGTERM) for r in apis), apis
    assert all(r["exit"] == 0 and r["handedBack"] > 0 for r in workers), workers
    assert sum(r["requestsHeld"] for r in apis) > 0, apis  # the drain had requests to finish

    # Clients: every answer 200 (or 503 with Retry-After), in time, nothing broken.
    assert clients.failures == [], clients.failures
    statuses = count_by((status, retry is not None) for _, _, status, retry, _ in clients.answers)
    assert set(statuses) <= {(200, False), (200, True), (503, True)}, statuses
    slowest = max(took for *_, took in clients.answers)
    print(
        f"client answers: {statuses}, slowest {slowest:.1f}s; by api: "
        f"{count_by(api for api, *_ in clients.answers)}"
    )
    assert slowest < CLIENT_TIMEOUT_S

    # Every run the clients started ended ok once; they saw it end so.
    runs = cluster.runs()
    started_ids = set(acknowledged) | set(trickled)
    assert started_ids <= {r.run_id for r in runs}, "an acknowledged run was lost"
    assert set(waited) == started_ids
    assert count_by(o["status"] for o in waited.values()) == {"ok": len(started_ids)}
    outcome = count_by((r.status, r.attempt) for r in runs)
    print(f"runs: {len(runs)} ({len(trickled)} during the restarts); (status, attempt): {outcome}")
    assert {r.status for r in runs} == {"ok"}, outcome
    assert any(r.attempt > 1 for r in runs), outcome  # handed-back runs ran again
    ends = run_ends(service.all_workers)
    assert set(ends) == {r.run_id for r in runs}, set(ends) ^ {r.run_id for r in runs}
    assert {k: n for k, n in ends.items() if n > 1} == {}

    checked = assert_transcripts_exact(cluster, runs)
    print(f"transcripts: {checked} messages checked, none missing or doubled")

    # Sends: the clients' answered; every flow done, its announce delivered once.
    assert len(sent) == CLIENT_SENDS
    assert all(s["status"] in ("ok", "timeout") and s.get("flowId") for s in sent), sent
    flows = cluster.flows()
    assert len(flows) == RUN_SENDS + CLIENT_SENDS and {f["status"] for f in flows} == {"done"}
    assert count_by(f["announce"]["status"] for f in flows) == {"delivered": len(flows)}
    spawns = cluster.spawns()
    assert count_by(s.get("announce") for s in spawns) == {"delivered": SPAWNS}
    seen = idempotency_counts(webhook)
    assert {d["idempotencyKey"] for d in cluster.deliveries()} == set(seen)
    assert {k: n for k, n in seen.items() if n > 1} == {}
    print(f"announces: {len(seen)} delivered, each once")
