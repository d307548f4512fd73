"""The `scale` scenario: what more apis and workers buy, on Redis and on RabbitMQ as broker,
and with the state on a Redis Cluster.

For each deployment shape (1x1, 1x2 and 2x2 apis x workers) and each column (`COLUMNS`: a
broker and where the state is) a stack of its own measures, with `messaging`'s code:
fire-and-forget runs per second (sends with ``timeoutSeconds=0``, completion from the run
records), send+wait p50 (back-to-back blocks), and Redis commands and CPU per run. The
columns: state and broker on the stack's Redis; state there and RabbitMQ as broker (a vhost
of its own, made and deleted with ``rabbitmqctl``); state on a private Redis Cluster of 3
primaries (``redis+cluster://``, every key in the prefix's one slot) with the stack's Redis
as broker, Redis commands and CPU then summed over the broker's Redis and every cluster
node. Beside them, in the same stack, the raw Celery anchor: a no-op task on Celery's
default prefork pool at its defaults, on the same broker (its results on the stack's
Redis). Several apis share the stack's one port (SO_REUSEPORT, as `switchboard up --apis N`
runs them); the load reaches them over several connections.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

from switchboard.bench.costs import CostMeter, Costs
from switchboard.bench.harness import (
    ONE_AGENT_STACK,
    REDIS,
    START_TIMEOUT_S,
    STATE_CLUSTER,
    TOKEN,
    WORKER_CONCURRENCY,
    BenchRun,
    Stack,
    phase,
)
from switchboard.bench.messaging import (
    _anchor_rate,
    _in_blocks,
    _latency_steps,
    _median,
    _product_rate,
)
from switchboard.bench.report import Outcome, latency_summary, ratio
from switchboard.shared.errors import Unavailable
from switchboard.shared.store.apis import ApiHeartbeats

SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (2, 2))  # (apis, workers)
BROKERS = ("redis", "rabbitmq")
CLUSTER_PRIMARIES = 3  # no replicas: the bench measures the load, not a failover
CLUSTER = f"redis-cluster-{CLUSTER_PRIMARIES}"
# Where the state is (a row's ``store``) -> primaries of its private cluster (0: none, the
# state is on the stack's Redis).
STORES = {"redis": 0, CLUSTER: CLUSTER_PRIMARIES}
# (broker, store) in the order measured; a cluster cannot be a broker: the stack's Redis is.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("redis", "redis"),
    ("rabbitmq", "redis"),
    ("redis", CLUSTER),
)
# The Redis servers a row's commands and Redis CPU are summed over, by store.
REDIS_COUNTED = {
    "redis": "the stack's Redis (state, broker and the anchor's results)",
    CLUSTER: f"the stack's Redis (broker and the anchor's results) + every node of the "
    f"{CLUSTER_PRIMARIES}-primary cluster (state: the slot owner; the others idle)",
}
ANCHOR = "prefork"  # Celery's defaults: prefork pool, one process per core
RABBITMQ_PORT = 5672
# Connections the send+wait loop spreads its calls over (SO_REUSEPORT hashes each
# connection to one api: with 8, all on one of two apis has odds of 1 in 128).
_CONNECTIONS = 8
_WARM_UP = 10


@dataclass(frozen=True)
class Counts:
    """How much one shape measures."""

    sends: int  # fire-and-forget runs per round
    rounds: int
    latency: int  # send+wait samples (and as many anchor round trips)


FULL = Counts(sends=1000, rounds=3, latency=200)
QUICK = Counts(sends=100, rounds=1, latency=20)


def scale(run: BenchRun) -> Outcome:
    """Runs/s, send+wait p50 and Redis commands per run for every shape in every column
    (broker and state store), each beside the prefork anchor on the same broker."""
    counts = QUICK if run.quick else FULL
    rows: list[dict[str, Any]] = []
    for broker, store in COLUMNS:
        with _broker(broker) as (url, missing):
            if missing is not None:
                rows.append({"broker": broker, "store": store, "skipped": missing})
                continue
            for apis, workers in SHAPES:
                rows.append(
                    _shape(run, counts, broker, url, store=store, apis=apis, workers=workers)
                )
            run.stacks.close()  # before the vhost goes
    return _outcome(rows, counts)


# -- one shape ----------------------------------------------------------------------------


def _shape(
    run: BenchRun,
    counts: Counts,
    broker: str,
    url: str | None,
    *,
    store: str,
    apis: int,
    workers: int,
) -> dict[str, Any]:
    label = f"scale {_column(broker, store)} {apis}x{workers}"
    st = run.stacks.get(
        label,
        config=ONE_AGENT_STACK["config"],
        worker_concurrency=WORKER_CONCURRENCY,
        workers=workers,
        apis=apis,
        anchors=(ANCHOR,),
        broker_url=url,
        state_cluster=STORES[store],
    )
    product = _product_processes(st, apis, workers)
    apps = st.anchor_apps()
    app = apps[ANCHOR]
    with phase(run.progress, f"{label}: warm up"):
        _wait_apis(st, apis)
        st.warm_up()
        st.warm_up_anchors(apps)
        _drain(st, url)
    ours: list[float] = []
    base: list[float] = []
    costs, anchor_costs = Costs(), Costs()
    cpu = dict.fromkeys(product, 0.0)  # CPU seconds per process over the sends' rounds
    completed = 0
    for round_no in range(counts.rounds):
        step = f"{label} round {round_no + 1}/{counts.rounds}"
        # The anchor first on odd rounds: neither side always runs on a machine just woken.
        sides = ("product", "anchor") if round_no % 2 == 0 else ("anchor", "product")
        for side in sides:
            if side == "anchor":
                with CostMeter(st, (f"anchor-{ANCHOR}", REDIS)).measure(anchor_costs):
                    base.append(_anchor_rate(st, app, run.progress, counts.sends, step))
                continue
            cpu_before = _cpu_s(st, cpu)
            with CostMeter(st, product).measure(costs):
                rate, ok = _product_rate(
                    st, run.progress, counts.sends, f"{step}: sends", tag=str(round_no)
                )
                with phase(run.progress, f"{step}: wait for follow-ups to drain"):
                    _drain(st, url)
            for name, spent in _cpu_s(st, cpu).items():
                cpu[name] += spent - cpu_before[name]
            ours.append(rate)
            completed += ok
    bad: list[dict[str, Any]] = []
    with _spread_client(st) as http:
        steps = {
            name: fn
            for name, fn in _latency_steps(st, http, apps, bad).items()
            if name in ("fresh", ANCHOR)
        }
        for i in range(_WARM_UP):
            for fn in steps.values():
                fn(-1 - i)
        samples = _in_blocks(st, run.progress, steps, counts.latency)
    ran = counts.sends * counts.rounds
    return _row(
        broker,
        store=store,
        apis=apis,
        workers=workers,
        ours=ours,
        base=base,
        sends=ran,
        completed=completed,
        costs=costs.summary(completed, unit="completed fire-and-forget run"),
        anchor_costs=anchor_costs.summary(ran, unit="no-op task"),
        latency=latency_summary(samples["fresh"]),
        anchor_latency=latency_summary(samples[ANCHOR]),
        cpu=cpu,
        bad=bad,
    )


def _row(
    broker: str,
    *,
    store: str,
    apis: int,
    workers: int,
    ours: Sequence[float],
    base: Sequence[float],
    sends: int,
    completed: int,
    costs: dict[str, Any],
    anchor_costs: dict[str, Any],
    latency: Mapping[str, float],
    anchor_latency: Mapping[str, float],
    cpu: Mapping[str, float],
    bad: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    runs_per_s, anchor_per_s = round(_median(ours), 1), round(_median(base), 1)
    api_cpu = {name: spent for name, spent in cpu.items() if name.startswith("api")}
    total_api_cpu = sum(api_cpu.values())
    return {
        "broker": broker,
        "store": store,
        "apis": apis,
        "workers": workers,
        "runsPerS": runs_per_s,
        "rounds": [round(x, 1) for x in ours],
        "sendWait": dict(latency),
        "anchor": {
            "what": f"no-op Celery task, Celery's defaults ({ANCHOR} pool), same broker",
            "tasksPerS": anchor_per_s,
            "rounds": [round(x, 1) for x in base],
            "roundTrip": dict(anchor_latency),
        },
        "runsPerSToAnchor": ratio(runs_per_s, anchor_per_s),
        "p50ToAnchor": ratio(latency["p50_ms"], anchor_latency["p50_ms"]),
        "costs": costs,
        "anchorCosts": anchor_costs,
        "cpuMsPerRun": cpu_ms_per_run(cpu, completed),
        # Redis commands and the redis CPU above are summed over these servers; the CPU
        # of each (the broker's Redis, the cluster's nodes) apart:
        "redisCounted": REDIS_COUNTED[store],
        "redisCpuMsPerRun": {
            name: round(spent * 1000 / completed, 3) if completed > 0 else None
            for name, spent in cpu.items()
            if name in (REDIS, STATE_CLUSTER)
        },
        # Each api's share of the api CPU over the throughput rounds: the load was spread.
        "apiCpuShare": {
            name: round(spent / total_api_cpu, 2) if total_api_cpu > 0 else None
            for name, spent in api_cpu.items()
        },
        "sends": sends,
        "completed": completed,
        "sendWaitNotOk": len(bad),
    }


def cpu_ms_per_run(cpu_s: Mapping[str, float], runs: int) -> dict[str, float | None]:
    """CPU milliseconds per run by role (``api``, ``worker``, ``redis``: every process of
    the role summed, ``api1`` with ``api``), from CPU seconds per process over ``runs``.
    One core serves ``1000 / ms`` runs per second of a role."""
    roles = {"api": 0.0, "worker": 0.0, "redis": 0.0}
    for name, spent in cpu_s.items():
        role = next((r for r in roles if name.startswith(r)), None)
        if role is not None:
            roles[role] += spent
    return {role: round(s * 1000 / runs, 3) if runs > 0 else None for role, s in roles.items()}


def _product_processes(st: Stack, apis: int, workers: int) -> tuple[str, ...]:
    """The stack's product processes (as `harness.stack` names them) and its Redis servers
    (its own, and the cluster the state is on, if it is)."""
    return (
        *(f"api{i or ''}" for i in range(apis)),
        *(f"worker{i}" for i in range(workers)),
        REDIS,
        *((STATE_CLUSTER,) if st.cluster is not None else ()),
    )


def _cpu_s(st: Stack, names: Mapping[str, float]) -> dict[str, float]:
    """User + system CPU seconds of each named process (with its children)."""
    out = {}
    for name in names:
        total = 0.0
        for proc in st.process_tree([name]):
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        out[name] = total
    return out


def _wait_apis(st: Stack, apis: int) -> None:
    """Wait until every api process has written its heartbeat (all of them serve)."""
    store = st.store()
    beats = ApiHeartbeats(store.redis, store.ks)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        st.polled_commands["hgetall"] += 1
        if len(beats.all()) >= apis:
            return
        st.check_alive()
        if time.monotonic() > deadline:
            raise Unavailable(f"{apis} api processes did not all start")
        time.sleep(0.2)


@contextlib.contextmanager
def _spread_client(st: Stack) -> Iterator[httpx.Client]:
    """A client of the api whose calls take turns over several keep-alive connections, so
    a loop of calls reaches every api sharing the port, not only the one its connection
    was hashed to."""
    transport = _RoundRobin(_CONNECTIONS)
    with httpx.Client(
        base_url=st.api_url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=120,
        transport=transport,
    ) as client:
        yield client


class _RoundRobin(httpx.BaseTransport):
    """Each request on the next of ``n`` connection pools (one connection each, in a loop)."""

    def __init__(self, n: int) -> None:
        self._pools = [httpx.HTTPTransport() for _ in range(n)]
        self._next = itertools.cycle(self._pools)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return next(self._next).handle_request(request)

    def close(self) -> None:
        for pool in self._pools:
            pool.close()


# -- brokers ------------------------------------------------------------------------------


@contextlib.contextmanager
def _broker(kind: str) -> Iterator[tuple[str | None, str | None]]:
    """(broker URL, None) for a kind — None for the stack's own Redis, a vhost of the run's
    own on RabbitMQ, deleted afterwards — or (None, why not) when RabbitMQ is missing."""
    if kind == "redis":
        yield None, None
        return
    missing = rabbitmq_missing()
    if missing is not None:
        yield None, missing
        return
    vhost = f"sb-bench-{secrets.token_hex(4)}"
    rabbitmqctl("add_vhost", vhost, check=True)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*", check=True)
        yield f"amqp://guest:guest@127.0.0.1:{RABBITMQ_PORT}/{vhost}", None
    finally:
        rabbitmqctl("delete_vhost", vhost)


def rabbitmqctl(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["rabbitmqctl", *args], capture_output=True, text=True, timeout=60, check=False
    )
    if check and done.returncode != 0:
        raise Unavailable(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip()[:200]}")
    return done


def rabbitmq_missing() -> str | None:
    """Why RabbitMQ cannot be used here (one line), or None."""
    if shutil.which("rabbitmqctl") is None:
        return "rabbitmqctl not found: RabbitMQ is not installed on this machine"
    with socket.socket() as probe:
        probe.settimeout(2)
        if probe.connect_ex(("127.0.0.1", RABBITMQ_PORT)) != 0:
            return f"no RabbitMQ listening on 127.0.0.1:{RABBITMQ_PORT}"
    listed = rabbitmqctl("list_vhosts", "--quiet")
    if listed.returncode != 0:
        return f"rabbitmqctl cannot manage the broker here: {listed.stderr.strip()[:120]}"
    return None


def _drain(st: Stack, broker_url: str | None) -> None:
    """Wait until no work is left: nothing active in Redis and, on RabbitMQ, no message
    ready or unacknowledged on the vhost's queues (Redis does not see those)."""
    st.wait_idle()
    if broker_url is None:
        return
    vhost = broker_url.rsplit("/", 1)[1]
    deadline = time.monotonic() + 120
    while _rabbitmq_messages(vhost) > 0:
        if time.monotonic() > deadline:
            raise Unavailable(f"RabbitMQ vhost {vhost} did not drain within 120s")
        time.sleep(0.5)
    st.wait_idle()


def _rabbitmq_messages(vhost: str) -> int:
    """Messages ready or unacknowledged on the product's queues of ``vhost``."""
    listed = rabbitmqctl(
        "list_queues", "-p", vhost, "name", "messages", "--quiet", "--no-table-headers", check=True
    )
    total = 0
    for line in listed.stdout.splitlines():
        parts = line.split()
        # Celery's own queues (pidbox, events) are not the product's work.
        if len(parts) == 2 and parts[0].startswith("sb.") and parts[1].isdigit():
            total += int(parts[1])
    return total


# -- the outcome --------------------------------------------------------------------------


def _column(broker: str, store: str) -> str:
    """A column's name: the broker, and where the state is when not on the stack's Redis."""
    return broker if store == "redis" else f"{broker} + state on {store}"


def _outcome(rows: list[dict[str, Any]], counts: Counts) -> Outcome:
    measured = [r for r in rows if "skipped" not in r]
    by = {(r["broker"], r["store"], r["apis"], r["workers"]): r for r in measured}
    one, four = by.get(("redis", "redis", 1, 1)), by.get(("redis", "redis", 2, 2))
    gain = ratio(four["runsPerS"], one["runsPerS"]) if one and four else None
    incomplete = sum(r["sends"] - r["completed"] for r in measured)
    not_ok = sum(r["sendWaitNotOk"] for r in measured)

    def text(r: dict[str, Any]) -> str:
        p50 = r["sendWait"]["p50_ms"]
        return f"{r['apis']}x{r['workers']} {r['runsPerS']:.0f}/s p50 {p50:.1f} ms"

    def anchor_text(broker: str) -> str:
        first = next((r for r in measured if r["broker"] == broker), None)
        if first is None:
            return f"{broker}: —"
        a = first["anchor"]
        return f"{broker}: {a['tasksPerS']:.0f} tasks/s, p50 {a['roundTrip']['p50_ms']:.1f} ms"

    parts = []
    for broker, store in COLUMNS:
        column = [r for r in rows if (r["broker"], r["store"]) == (broker, store)]
        shown = [text(r) for r in column if "skipped" not in r]
        skipped = [r["skipped"] for r in column if "skipped" in r]
        if shown:
            parts.append(f"{_column(broker, store)}: " + ", ".join(shown))
        elif skipped:
            parts.append(f"{_column(broker, store)}: skipped ({skipped[0]})")
    per_run = {
        store: r["costs"].get("redisCommands")
        for store in STORES
        if (r := by.get(("redis", store, 1, 1))) is not None
    }
    if per_run.get("redis") is not None:
        parts.append(f"{per_run['redis']:g} Redis commands per run")
    if per_run.get(CLUSTER) is not None:
        parts.append(f"{per_run[CLUSTER]:g} with the state on {CLUSTER} (broker's Redis + nodes)")
    return Outcome(
        scenario="scale",
        title="apis x workers on Redis and RabbitMQ, and with the state on a Redis Cluster",
        figure={"shapes": rows, "scaleOutGain": gain},
        anchor={
            "what": "no-op Celery task on Celery's default prefork pool at its defaults, "
            "on the same broker, measured in each shape's stack (in the first one here)",
            **{b: anchor_text(b) for b in BROKERS},
        },
        ratio=gain,
        ratio_text="runs/s 2x2 / runs/s 1x1, state and broker on the stack's Redis",
        target="every shape measured in every column available (a sizing figure; no speed target)",
        passed=True,
        figure_text="; ".join(parts),
        anchor_text="; ".join(anchor_text(b) for b in BROKERS),
        parameters={
            "shapes": [f"{a}x{w}" for a, w in SHAPES],
            "brokers": list(BROKERS),
            "columns": [_column(broker, store) for broker, store in COLUMNS],
            "sendsPerRound": counts.sends,
            "rounds": counts.rounds,
            "sendWaitSamples": counts.latency,
            "runsPerS": "POST /tools/invoke sessions_send timeoutSeconds=0, 32 requests in "
            "flight, from the first request to the last target run's end; median of rounds",
            "sendWait": "POST /tools/invoke sessions_send timeoutSeconds=30, back-to-back "
            f"blocks, over {_CONNECTIONS} keep-alive connections taken in turn",
            "apis": "several api processes share one port with SO_REUSEPORT",
            "workerConcurrency": WORKER_CONCURRENCY,
            "model": "builtin/echo",
            "maxPingPongTurns": 0,
            "costs": "INFO commandstats of the stack's Redis (and of every cluster node when "
            "the state is on the cluster, summed) and /proc CPU of every api, worker and "
            "redis-server, from the first send until follow-ups drained; on RabbitMQ the "
            "broker's traffic is not in the Redis count",
            "anchor": f"celery -A switchboard.bench.anchor worker ({ANCHOR} pool, "
            "concurrency = cores), one per stack; its results on the stack's Redis",
            "cluster": f"{CLUSTER}: the state on a private Redis Cluster of "
            f"{CLUSTER_PRIMARIES} primaries, no replicas (redis+cluster://, key prefix "
            "{sb}:, so all on one slot's owner), the broker and the anchor on the stack's "
            "Redis; Redis commands and CPU: " + REDIS_COUNTED[CLUSTER],
        },
        checks={"allCompleted": incomplete == 0, "sendWaitAllOk": not_ok == 0},
        costs={
            f"{_column(r['broker'], r['store'])} {r['apis']}x{r['workers']}": r["costs"]
            for r in measured
        },
        notes=[
            *([f"{incomplete} fire-and-forget run(s) did not complete ok"] if incomplete else []),
            *([f"{not_ok} send+wait(s) did not answer ok"] if not_ok else []),
        ],
    )
