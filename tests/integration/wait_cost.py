"""What ``SWITCHBOARD_REDIS_WAIT_REPLICAS`` costs: send+wait and send latency, WAIT off and on.

A private primary and one replica (real redis-servers, loopback). First a run's accept in
the store alone (`RunStore.start`: one script call), ``--calls`` times per setting in
turn. Then an api and a worker of the product per setting (`faultkit.Cluster`, each on a
database of its own), and ``--runs`` times, alternating between them, a send (`agent`,
timed alone: the accept) and its `agent.wait` (timed together: send+wait, a run's whole
round trip through the worker). Prints p50 and p90. A measurement, not a test::

    .venv/bin/python tests/integration/wait_cost.py --runs 300

docs/operations.md ("Replication and acknowledged writes") quotes its output.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))

from faultkit import TOKEN, Cluster, base_config, wait_until

from switchboard.shared.store import Store
from switchboard.shared.store.durability import Durability
from switchboard.shared.store.runs import NewRun, now_ms
from switchboard.supervisor.redis_server import RedisServer
from switchboard_testkit.redis_sentinel import RedisReplica
from switchboard_testkit.webhook_receiver import WebhookReceiver

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def _start(
    primary: RedisServer, where: Path, webhook_url: str, replicas: int
) -> tuple[Cluster, str]:
    """An api and a worker on database ``replicas + 1`` of the primary (one per setting, so
    neither worker takes the other's runs), WAIT for ``replicas``."""
    where.mkdir(parents=True)
    cluster = Cluster(
        f"{primary.url.rsplit('/', 1)[0]}/{replicas + 1}",
        where,
        base_config(webhook_url),
        env_extra={"SWITCHBOARD_REDIS_WAIT_REPLICAS": str(replicas)},
    )
    cluster.worker(concurrency=4)
    _, url = cluster.api()
    return cluster, url


def _round(client: httpx.Client, n: int) -> tuple[float, float]:
    """One send and its wait: (send ms, send+wait ms)."""
    started = time.perf_counter()
    body = {"sessionKey": f"cost-{n % 8}", "message": f"hello {n}"}
    resp = client.post("/rpc", json={"method": "agent", "params": body})
    sent = time.perf_counter()
    resp.raise_for_status()
    wait = {"runId": resp.json()["runId"], "timeoutMs": 30_000}
    ended = client.post("/rpc", json={"method": "agent.wait", "params": wait})
    done = time.perf_counter()
    assert ended.json()["status"] == "ok", ended.text
    return (sent - started) * 1000, (done - started) * 1000


def measure(primary: RedisServer, where: Path, webhook_url: str, runs: int) -> list[str]:
    """Both settings side by side, their rounds alternating (so a machine's load drifts
    over both alike)."""
    clusters = [_start(primary, where / f"wait{r}", webhook_url, r) for r in (0, 1)]
    times: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
    try:
        clients = [httpx.Client(base_url=url, headers=AUTH, timeout=30) for _, url in clusters]
        for n in range(runs + 20):  # the first 20 warm up (connections, scripts)
            for replicas, client in enumerate(clients):
                took = _round(client, n)
                if n >= 20:
                    times[replicas].append(took)
        for client in clients:
            client.close()
    finally:
        for cluster, _ in clusters:
            cluster.stop_all()
            cluster.services.store.close()
    lines = []
    for replicas, pairs in times.items():
        sends = [p[0] for p in pairs]
        rounds = [p[1] for p in pairs]
        lines.append(
            f"WAIT replicas={replicas}: send p50 {_pct(sends, 50):.2f} ms p90 "
            f"{_pct(sends, 90):.2f} ms; send+wait p50 {_pct(rounds, 50):.2f} ms p90 "
            f"{_pct(rounds, 90):.2f} ms ({runs} runs)"
        )
    return lines


def store_accepts(primary: RedisServer, calls: int) -> list[str]:
    """A run's accept alone (`RunStore.start`, one script call), WAIT off and on in turn."""
    stores = {r: Store.from_url(primary.url, durability=Durability(r, 1000)) for r in (0, 1)}
    times: dict[int, list[float]] = {0: [], 1: []}
    try:
        for n in range(calls + 200):
            for replicas, store in stores.items():
                message = {"role": "user", "content": "hi", "timestamp": now_ms()}
                run = NewRun(f"cost-{replicas}-{n}", f"agent:main:c{replicas}-{n}", message, 60)
                started = time.perf_counter()
                store.runs.start(run)
                if n >= 200:
                    times[replicas].append((time.perf_counter() - started) * 1e6)
    finally:
        for store in stores.values():
            store.close()
    return [
        f"store accept, WAIT replicas={r}: p50 {_pct(t, 50):.0f} us p90 {_pct(t, 90):.0f} us "
        f"({calls} calls)"
        for r, t in times.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1, help="api measurements, one by one")
    parser.add_argument("--calls", type=int, default=3000, help="store accepts per setting")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, WebhookReceiver() as webhook:
        where = Path(tmp)
        primary = RedisServer(where / "primary")
        primary.start()
        replica = RedisReplica(where / "replica", primary.port)
        replica.start()
        try:

            def synced() -> bool:
                with replica.client() as client:
                    return bool(client.info("replication")["master_link_status"] == "up")

            wait_until(synced, 30, "the replica to sync", 0.1)
            for line in store_accepts(primary, args.calls):
                print(line, flush=True)
            for n in range(args.rounds):
                for line in measure(primary, where / f"round{n}", webhook.url, args.runs):
                    print(line, flush=True)
        finally:
            replica.stop()
            primary.stop()


if __name__ == "__main__":
    main()
