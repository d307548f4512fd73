"""The scale tests' kit: a service of several api, worker and beat processes on one Redis
(the fault tests' `Cluster`, ``tests/faults/faultkit.py``), RabbitMQ as its broker (a vhost
of the test's own), and what the workers' logs say each of them did."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from switchboard.bench.shapes import RABBITMQ_PORT, rabbitmq_missing, rabbitmqctl
from switchboard.shared.errors import Unavailable
from switchboard.supervisor.redis_cluster import RedisClusterGroup
from switchboard.supervisor.redis_server import find_redis_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "faults"))

from faultkit import TOKEN, Cluster, Proc, base_config, free_port, merged

BROKERS = ("redis", "rabbitmq")


# --- RabbitMQ: a vhost of the test's own, never the default one ------------------------------


@contextlib.contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """The amqp:// URL of a new vhost `sb-test-<random>` (guest may use it), deleted after;
    skips the test when RabbitMQ is not available."""
    missing = rabbitmq_missing()
    if missing:
        pytest.skip(missing)
    vhost = f"sb-test-{secrets.token_hex(4)}"
    made = rabbitmqctl("add_vhost", vhost)
    assert made.returncode == 0, made.stderr
    try:
        allowed = rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        assert allowed.returncode == 0, allowed.stderr
        yield f"amqp://guest:guest@127.0.0.1:{RABBITMQ_PORT}/{vhost}"
    finally:
        rabbitmqctl("delete_vhost", vhost)


@contextlib.contextmanager
def broker_for(kind: str) -> Iterator[str | None]:
    """The broker URL of a kind: None for Redis (the store's own), a private vhost else."""
    if kind == "redis":
        yield None
    else:
        with rabbitmq_vhost() as url:
            yield url


# --- Redis Cluster: a private one of three primaries -------------------------------------------


@contextlib.contextmanager
def redis_cluster(where: Path) -> Iterator[RedisClusterGroup]:
    """A private Redis Cluster of three primaries (no replicas) under ``where``; skips the
    test where no redis-server can run one."""
    try:
        find_redis_server()
    except Unavailable as exc:
        pytest.skip(f"no redis-server to run a Redis Cluster: {exc}")
    with RedisClusterGroup(where, primaries=3) as group:
        yield group


# --- which worker ran what -------------------------------------------------------------------

_ENDED = re.compile(r"^run (\S+) ended: ")
_RECOVERED = re.compile(r"^sweep recovered (.*)$")
_ARCHIVED = re.compile(r"^archived (\d+) sub-agent session")


def _events(proc: Proc) -> Iterator[str]:
    """The `event` of every JSON log line of a process."""
    for line in proc.output().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and isinstance(record.get("event"), str):
                yield record["event"]


def runs_ended_by(proc: Proc) -> set[str]:
    """The run ids a worker ended (its INFO line `run <id> ended: <status>`)."""
    return {m.group(1) for e in _events(proc) if (m := _ENDED.match(e))}


def run_ends(procs: list[Proc]) -> Counter[str]:
    """How many times each run id ended in these workers' logs, all together."""
    return Counter(m.group(1) for proc in procs for e in _events(proc) if (m := _ENDED.match(e)))


_HANDED_BACK = re.compile(r"^stopping: (\d+) run\(s\) handed back")


def runs_handed_back(proc: Proc) -> int:
    """How many runs a worker handed back to the queue as it stopped (SIGTERM)."""
    return sum(int(m.group(1)) for e in _events(proc) if (m := _HANDED_BACK.match(e)))


_RECEIVED = re.compile(r"^Task switchboard\.(run|runs|resume)\[\S+\] received")


def runs_received_by(proc: Proc) -> int:
    """How many run messages a worker took from the broker (Celery's `received` lines)."""
    return sum(1 for e in _events(proc) if _RECEIVED.match(e))


def sweep_totals(procs: list[Proc]) -> dict[str, int]:
    """What every sweep these workers ran recovered, summed (`requeued`, `resent`, …), and
    how many sub-agent sessions they archived (`archived`)."""
    totals: dict[str, int] = {}
    for proc in procs:
        for event in _events(proc):
            if m := _RECOVERED.match(event):
                for part in m.group(1).split(", "):
                    name, _, count = part.partition("=")
                    totals[name] = totals.get(name, 0) + int(count)
            elif m := _ARCHIVED.match(event):
                totals["archived"] = totals.get("archived", 0) + int(m.group(1))
    return totals


# --- the service -----------------------------------------------------------------------------


class Service:
    """Two apis, two workers (distinct node names) and two beats (own schedule files) on
    one Redis: one service. `http[i]` talks to api i (on the same port after a restart);
    `restart_api` and `restart_worker` replace one process gracefully (a rolling restart)."""

    def __init__(self, cluster: Cluster, workers: int = 2, concurrency: int = 2) -> None:
        self.cluster = cluster
        self.concurrency = concurrency
        self.workers = [
            cluster.worker(concurrency=concurrency, node=self.node(n))
            for n in range(1, workers + 1)
        ]
        self.beats = [cluster.beat(cluster.workdir / f"beat{n}") for n in (1, 2)]
        self.apis: list[Proc] = []
        self.http: list[httpx.Client] = []
        self.ports: list[int] = []
        for _ in (1, 2):
            port = free_port()
            proc, url = cluster.api(port)
            self.apis.append(proc)
            self.ports.append(port)
            self.http.append(
                httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=90)
            )
        # Every worker process that ran, the stopped ones too (their logs say what they ended).
        self.all_workers: list[Proc] = list(self.workers)

    @staticmethod
    def node(n: int) -> str:
        """The Celery node name of worker `n` (1-based), its replacements' too."""
        return f"worker{n}@%h"

    def restart_api(self, api: int, grace_s: float = 30) -> Proc:
        """SIGTERM api `api` (0 or 1): it stops listening and finishes the requests it holds;
        then a new api process on the same port, returned once /healthz answers. The old
        one's exit code is its `popen.returncode` (-9 when the grace ran out)."""
        self.cluster.stop(self.apis[api], grace_s)
        self.apis[api], _ = self.cluster.api(self.ports[api])
        return self.apis[api]

    def restart_worker(self, index: int, grace_s: float = 60) -> Proc:
        """SIGTERM worker `index` (0-based): it hands its runs back and exits; then a new
        worker with the same node name, returned once it consumes."""
        self.cluster.stop(self.workers[index], grace_s)
        replacement = self.cluster.worker(concurrency=self.concurrency, node=self.node(index + 1))
        self.workers[index] = replacement
        self.all_workers.append(replacement)
        return replacement

    def rpc(self, api: int, method: str, **params: Any) -> Any:
        """A gateway method on api `api` (0 or 1), its answer decoded."""
        resp = self.http[api].post("/rpc", json={"method": method, "params": params})
        assert resp.status_code == 200, resp.text
        return resp.json()

    def tool(self, api: int, session_key: str, tool: str, **args: Any) -> Any:
        """A tool invoked on api `api` for `session_key`; its result."""
        body = {"tool": tool, "args": args, "sessionKey": session_key}
        resp = self.http[api].post("/tools/invoke", json=body)
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert answer.get("ok") is True, answer
        return answer["result"]

    def ran_on(self) -> dict[str, str]:
        """Run id -> the node of the worker that ended it."""
        return {
            run_id: f"worker{n}"
            for n, proc in enumerate(self.workers, start=1)
            for run_id in runs_ended_by(proc)
        }

    def close(self) -> None:
        for client in self.http:
            client.close()


def make_cluster(redis_url: str, workdir: Path, webhook_url: str, broker: str | None) -> Cluster:
    """A faultkit cluster (the fault tests' base config) with the broker given."""
    # Five ping-pong turns: long flows, whose rounds are runs a worker takes (on the plain
    # path each round is a message of its own, taken by any worker).
    config = merged(
        base_config(webhook_url), {"session": {"agentToAgent": {"maxPingPongTurns": 5}}}
    )
    return Cluster(redis_url, workdir, config, broker_url=broker)
