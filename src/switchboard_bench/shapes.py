"""The `scale` scenario: what more apis and workers buy, on Redis and on RabbitMQ as broker,
and with the state on a Redis Cluster.

For each deployment shape (1x1, 1x2 and 2x2 apis x workers) and each column (`COLUMNS`: a
broker and where the state is) a stack of its own measures, with `messaging`'s code:
fire-and-forget runs per second (sends with ``timeoutSeconds=0``, completion from the run
records), send+wait p50 (back-to-back blocks), and Redis commands and CPU per run. The
columns: state and broker on the stack's Redis; state there and RabbitMQ as broker (a vhost
of its own, made and deleted with ``rabbitmqctl``); state on a private Redis Cluster of 3
primaries (``redis+cluster://``, the keys cut into 64 slot groups and so spread over every
primary) with the stack's Redis as broker, Redis commands and CPU then summed over the
broker's Redis and every cluster node, and each primary's share of them measured too
(``stateSpread``: `costs.SpreadMeter`). Beside them, in the same stack, the raw Celery
anchor: a no-op task on Celery's default prefork pool at its defaults, on the same broker
(its results on the stack's Redis). Several apis share the stack's one port (SO_REUSEPORT,
as `switchboard up --apis N` runs them); the load reaches them over several connections.
The shapes, the columns and the outcome are `shapes_report`'s.
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
from typing import Any

import httpx
import psutil

from switchboard.shared.errors import Unavailable
from switchboard.shared.store.apis import ApiHeartbeats
from switchboard_bench.costs import CostMeter, Costs, Spread, SpreadMeter
from switchboard_bench.harness import (
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
from switchboard_bench.messaging import (
    _anchor_rate,
    _in_blocks,
    _latency_steps,
    _median,
    _product_rate,
)
from switchboard_bench.report import Outcome, latency_summary, ratio
from switchboard_bench.shapes_report import (
    ANCHOR,
    COLUMNS,
    CONNECTIONS,
    FULL,
    QUICK,
    REDIS_COUNTED,
    SHAPES,
    STORES,
    Counts,
    column,
    outcome,
)

RABBITMQ_PORT = 5672
_WARM_UP = 10


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
    return outcome(rows, counts)


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
    label = f"scale {column(broker, store)} {apis}x{workers}"
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
        # Which primary owns which slot group: asked of the cluster before the rounds.
        spread_meter = SpreadMeter(st) if st.cluster is not None else None
    ours: list[float] = []
    base: list[float] = []
    costs, anchor_costs, spread, broker_costs = Costs(), Costs(), Spread(), Costs()
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
            with contextlib.ExitStack() as meters:
                meters.enter_context(CostMeter(st, product).measure(costs))
                if spread_meter is not None:  # the state's primaries, the broker's Redis apart
                    meters.enter_context(spread_meter.measure(spread))
                    meters.enter_context(CostMeter(st, (REDIS,)).measure(broker_costs))
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
        cluster=None
        if spread_meter is None
        else {
            "stateSpread": spread.summary(completed),
            "brokerCosts": broker_costs.summary(completed, unit="completed run, on the broker"),
        },
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
    cluster: dict[str, Any] | None = None,
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
        # With the state on a cluster: each primary's share of its commands and CPU over
        # the throughput rounds, the busiest one's over the mean (`costs.Spread`), and the
        # broker's Redis alone (its commands and CPU per run).
        **(cluster or {}),
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
    transport = _RoundRobin(CONNECTIONS)
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
