"""The scale tests' kit: a service of several api, worker and beat processes on one Redis
(the fault tests' `Cluster`, ``tests/faults/faultkit.py``), RabbitMQ as its broker (a vhost
of the test's own), a private Redis Cluster for its state, what the workers' logs say each
of them did, and the burst tests' clients, burst and checks."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from switchboard.shared.delivery.records import TERMINAL_STATUSES
from switchboard.shared.errors import Unavailable
from switchboard.supervisor.redis_server import find_redis_server
from switchboard_bench.shapes import RABBITMQ_PORT, rabbitmq_missing, rabbitmqctl
from switchboard_testkit.redis_cluster import RedisClusterGroup

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "faults"))

from faultkit import CHANNEL, TOKEN, Proc, base_config, free_port, merged

# The folder's conftest takes these from here (this module puts faultkit on the path).
from faultkit import Cluster as Cluster
from faultkit import redis_sentinel_group as redis_sentinel_group

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


def events(proc: Proc) -> Iterator[str]:
    """The `event` of every JSON log line of a process."""
    for line in proc.output().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and isinstance(record.get("event"), str):
                yield record["event"]


def runs_ended_by(proc: Proc) -> set[str]:
    """The run ids a worker ended (its INFO line `run <id> ended: <status>`)."""
    return {m.group(1) for e in events(proc) if (m := _ENDED.match(e))}


def run_ends(procs: list[Proc]) -> Counter[str]:
    """How many times each run id ended in these workers' logs, all together."""
    return Counter(m.group(1) for proc in procs for e in events(proc) if (m := _ENDED.match(e)))


_HANDED_BACK = re.compile(r"^stopping: (\d+) run\(s\) handed back")


def runs_handed_back(proc: Proc) -> int:
    """How many runs a worker handed back to the queue as it stopped (SIGTERM)."""
    return sum(int(m.group(1)) for e in events(proc) if (m := _HANDED_BACK.match(e)))


_RECEIVED = re.compile(r"^Task switchboard\.(run|runs|resume)\[\S+\] received")


def runs_received_by(proc: Proc) -> int:
    """How many run messages a worker took from the broker (Celery's `received` lines, at
    DEBUG: `make_cluster`)."""
    return sum(1 for e in events(proc) if _RECEIVED.match(e))


def sweep_totals(procs: list[Proc]) -> dict[str, int]:
    """What every sweep these workers ran recovered, summed (`requeued`, `resent`, …), and
    how many sub-agent sessions they archived (`archived`)."""
    totals: dict[str, int] = {}
    for proc in procs:
        for event in events(proc):
            if m := _RECOVERED.match(event):
                for part in m.group(1).split(", "):
                    name, _, count = part.partition("=")
                    totals[name] = totals.get(name, 0) + int(count)
            elif m := _ARCHIVED.match(event):
                totals["archived"] = totals.get("archived", 0) + int(m.group(1))
    return totals


# `fenced: run|delivery <id> attempt <n>: <write> …`: a write the attempt fence refused.
_FENCED = re.compile(r"^fenced: (run|delivery) (\S+) attempt (\d+): (\S+)")


def fenced_writes(proc: Proc, of: str = "run") -> list[tuple[str, int, str]]:
    """(id, attempt, write) of every write of this process to a run (or a delivery) the
    attempt fence refused."""
    return [
        (m.group(2), int(m.group(3)), m.group(4))
        for e in events(proc)
        if (m := _FENCED.match(e)) and m.group(1) == of
    ]


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
    # Its processes log at DEBUG: the scale tests see which worker took a run by Celery's
    # `received` lines, DEBUG lines since a run is one INFO line (its end).
    debug = {"SWITCHBOARD_LOG_LEVEL": "DEBUG"}
    return Cluster(redis_url, workdir, config, broker_url=broker, env_extra=debug)


# --- a burst under a fault: the clients, the burst, and when it has settled ------------------

RUN_SENDS = 10  # runs whose model makes a waiting send (the run parks), reply-back on
SPAWNS = 10  # runs whose model spawns a sub-agent (its announce goes to the chat)
CLIENT_SENDS = 10  # clients' own waiting sends (`/tools/invoke`), reply-back on
WAITERS = 12  # client threads waiting for the runs
WAIT_MS = 3_000  # each `agent.wait` (an api being stopped finishes it within this)
SEND_WAIT_S = 5  # a client's waiting send (likewise)
CLIENT_TIMEOUT_S = 20.0  # every client request's own timeout: a hang past it is a failure
RETRY_AFTER_CAP_S = 5.0


@dataclass
class Clients:
    """The test's HTTP clients (one per api, taking turns among those that are up) and
    every answer they got."""

    http: list[httpx.Client]
    up: list[bool] = field(default_factory=list)  # which apis take new requests
    answers: list[tuple[int, str, int, str | None, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    turn: int = 0
    open: list[int] = field(default_factory=list)  # requests in progress, per api

    def __post_init__(self) -> None:
        self.up = self.up or [True] * len(self.http)
        self.open = self.open or [0] * len(self.http)

    def pick(self) -> int:
        """An api that is up, taking turns."""
        with self.lock:
            self.turn += 1
            live = [i for i, ok in enumerate(self.up) if ok]
            return live[self.turn % len(live)]

    def post(self, path: str, body: dict[str, Any], api: int | None = None) -> Any:
        """POST to an api (one that is up, unless ``api`` names one) until it answers 200:
        a 503 must carry Retry-After (waited, then tried again); anything else, a broken
        connection or a request past CLIENT_TIMEOUT_S is recorded as a failure (and tried
        again, so the test goes on)."""
        while True:
            chosen = self.pick() if api is None else api
            what = f"{path} {body.get('method') or body.get('tool')}"
            started = time.monotonic()
            with self.lock:
                self.open[chosen] += 1
            try:
                resp = self.http[chosen].post(path, json=body, timeout=CLIENT_TIMEOUT_S)
            except httpx.HTTPError as exc:
                took = time.monotonic() - started
                with self.lock:
                    self.failures.append(f"api {chosen} {what}: {exc!r} after {took:.1f}s")
                time.sleep(0.5)
                continue
            finally:
                with self.lock:
                    self.open[chosen] -= 1
            took = time.monotonic() - started
            retry_after = resp.headers.get("retry-after")
            with self.lock:
                self.answers.append((chosen, what, resp.status_code, retry_after, took))
            if resp.status_code == 200:
                return resp.json()
            if resp.status_code == 503 and retry_after is not None:
                time.sleep(min(float(retry_after), RETRY_AFTER_CAP_S))
                continue
            with self.lock:
                self.failures.append(f"api {chosen} {what}: {resp.status_code} {resp.text[:300]}")
            time.sleep(0.5)

    def rpc(self, method: str, api: int | None = None, **params: Any) -> Any:
        return self.post("/rpc", {"method": method, "params": params}, api)

    def start(self, session_key: str, message: str, api: int | None = None) -> str:
        """A run started by `agent`; its id."""
        accepted = self.rpc("agent", api, sessionKey=session_key, message=message)
        assert accepted["status"] == "accepted", accepted
        return str(accepted["runId"])

    def send(self, asker: str, target: str, message: str, api: int) -> dict[str, Any]:
        """A client's waiting send (`sessions_send` invoked for `asker`)."""
        body = {
            "tool": "sessions_send",
            "sessionKey": asker,
            "args": {"sessionKey": target, "message": message, "timeoutSeconds": SEND_WAIT_S},
        }
        answer = self.post("/tools/invoke", body, api)
        assert answer.get("ok") is True, answer
        return dict(answer["result"])

    def wait(self, run_id: str) -> dict[str, Any]:
        """`agent.wait` in short waits, each on an api that is up, until the run ended."""
        while True:
            outcome = self.rpc("agent.wait", runId=run_id, timeoutMs=WAIT_MS)
            if "pending" not in outcome:
                return dict(outcome)


def tool_line(name: str, args: dict[str, Any]) -> str:
    """The fake model's line that calls tool ``name`` with ``args``."""
    return f"/tool {name} {json.dumps(args)}"


def start_burst(
    clients: Clients, plain_sessions: int, plain_queued: int, sleeps: int
) -> tuple[list[str], set[str]]:
    """Starts the burst on both apis: RUN_SENDS runs making a waiting send, SPAWNS runs
    spawning a sub-agent, and ``plain_queued`` plain runs in each of ``plain_sessions``
    lanes (sleeping 2 to ``1 + sleeps`` s); the run ids, and those whose model calls a
    tool."""
    ids: list[str] = []
    for i in range(RUN_SENDS):
        line = tool_line(
            "sessions_send",
            {
                "sessionKey": f"agent:main:{CHANNEL}:group:target-{i}",
                "message": f"/sleep 2\n/reply round {i}",
                "timeoutSeconds": 120,
            },
        )
        ids.append(clients.start(f"agent:main:hook:asker-{i}", line, i % 2))
    for i in range(SPAWNS):
        line = tool_line("sessions_spawn", {"task": f"child {i}\n/sleep 2\n/reply child {i}"})
        ids.append(clients.start(f"agent:main:{CHANNEL}:group:parent-{i}", line, i % 2))
    tool_runs = set(ids)
    for i in range(plain_sessions):
        for j in range(plain_queued):
            message = f"/sleep {2 + (i + j) % sleeps}\nplain {i}.{j}"
            ids.append(clients.start(f"agent:main:hook:plain-{i}", message, (i + j) % 2))
    return ids, tool_runs


def settled(cluster: Cluster) -> bool:
    """Every run ended, every flow and spawn done, every delivery settled."""
    return (
        all(r.terminal for r in cluster.runs())
        and all(f["status"] == "done" for f in cluster.flows())
        and all(s.get("status") == "done" for s in cluster.spawns())
        and all(d["status"] in TERMINAL_STATUSES for d in cluster.deliveries())
    )


def unsettled(cluster: Cluster) -> dict[str, Any]:
    """What keeps the service from settling (for a timeout's message)."""
    return {
        "runs": [
            (r.run_id, r.session_key, r.status, r.attempt, r.parked)
            for r in cluster.runs()
            if not r.terminal
        ],
        "flows": [
            (f["flowId"], f["status"], f.get("turn"))
            for f in cluster.flows()
            if f["status"] != "done"
        ],
        "spawns": [s for s in cluster.spawns() if s.get("status") != "done"],
        "deliveries": [d for d in cluster.deliveries() if d["status"] not in TERMINAL_STATUSES],
    }
