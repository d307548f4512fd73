"""The Prometheus counters of one process (prometheus_client), added where the work is done.

Each api and worker process counts what it did itself, in memory: the runs it claimed and
ended, the reply-back rounds it started, the announces and deliveries it settled. Nothing
is counted in Redis, so a run's steps pay no command for it. Prometheus scrapes every process
and sums them (``sum by (status) (rate(switchboard_runs_ended_total[5m]))``): the
cluster-wide view is Prometheus's. An api serves its process's counters on ``/metrics``,
with the gauges read from Redis at scrape time (`api.metrics`); a worker serves its own on
``SWITCHBOARD_METRICS_PORT`` (`serve`). The processes of one host can answer as one:
with prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, which
``switchboard up`` sets), a scrape of any of them sums every process of the host.

A counter is added once the state change it counts was made (the step's script answered
that it moved), so a step that runs twice counts once.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

from switchboard.shared.store.run_records import LEDGER_TERMINAL, RunRecord, ledger_state

# Upper bounds of the run duration histogram (s), from the first claim to the end (parked
# time included).
RUN_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)

# Upper bounds of the tool call latency and slot wait histograms (s).
TOOL_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)

# The environment variable that puts prometheus_client in multiprocess mode (its own name).
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


class Metrics:
    """The counters of one process, in a registry of their own (one per `Services`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.runs_started = Counter(
            "switchboard_runs_started", "Agent runs started (first claim).", registry=r
        )
        self.runs_ended = Counter(
            "switchboard_runs_ended", "Agent runs ended, by status.", ["status"], registry=r
        )
        self.runs_terminal = Counter(
            "switchboard_runs_terminal",
            "Agent runs ended, by run ledger state (succeeded, failed, timed_out, cancelled, "
            "lost).",
            ["state"],
            registry=r,
        )
        for state in LEDGER_TERMINAL:  # every terminal state shows, 0 until one ends so
            self.runs_terminal.labels(state)
        self.run_duration = Histogram(
            "switchboard_run_duration_seconds",
            "Agent run duration from the first claim to the end (parked time included).",
            buckets=RUN_DURATION_BUCKETS_S,
            registry=r,
        )
        self.a2a_rounds = Counter(
            "switchboard_a2a_rounds",
            "Reply-back rounds started after a sessions_send.",
            registry=r,
        )
        self.announces = Counter(
            "switchboard_announces",
            "Announces settled, by kind (subagent, a2a) and outcome.",
            ["kind", "outcome"],
            registry=r,
        )
        self.deliveries = Counter(
            "switchboard_deliveries",
            "Delivery attempts settled, by outcome (delivered, failed, denied, retry).",
            ["outcome"],
            registry=r,
        )
        self.tools = ToolMetrics(r)  # per tool server: calls, errors, latency, in flight

        self.batch_lines = Counter(
            "switchboard_batch_lines",
            "Batch lines answered, by outcome (completed, failed, cancelled, expired, refused).",
            ["outcome"],
            registry=r,
        )

    def run_started(self) -> None:
        """A run was claimed for the first time."""
        self.runs_started.inc()

    def run_ended(self, status: str, run: RunRecord | None) -> None:
        """A run ended with ``status`` (``run``: as its end step stored it); its duration
        from its first claim counts when it had one."""
        self.runs_ended.labels(status).inc()
        self.runs_terminal.labels(ledger_state(status)).inc()
        if run is not None and run.started_at_ms is not None and run.ended_at_ms is not None:
            self.run_duration.observe(max(0, run.ended_at_ms - run.started_at_ms) / 1000)

    def announced(self, kind: str, outcome: str) -> None:
        """An announce settled (``kind``: subagent | a2a)."""
        self.announces.labels(kind, outcome).inc()

    def delivery(self, outcome: str) -> None:
        """A delivery attempt settled."""
        self.deliveries.labels(outcome).inc()

    def batch_line(self, outcome: str, count: int = 1) -> None:
        """``count`` batch lines were answered with ``outcome``."""
        self.batch_lines.labels(outcome).inc(count)


class ToolMetrics:
    """Per tool server (label ``server``): calls, errors by kind, call latency, slot wait,
    and the calls in flight and waiting for a slot in this process (gauges summed over the
    host's live processes in multiprocess mode)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.calls = Counter(
            "switchboard_tool_calls", "Tool calls ended, by tool server.", ["server"], registry=r
        )
        self.errors = Counter(
            "switchboard_tool_errors",
            "Tool calls that returned a tool error, by server and kind (error, timeout, no_slot).",
            ["server", "kind"],
            registry=r,
        )
        self.latency = Histogram(
            "switchboard_tool_call_duration_seconds",
            "Tool call duration, slot wait excluded, by tool server.",
            ["server"],
            buckets=TOOL_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.slot_wait = Histogram(
            "switchboard_tool_slot_wait_seconds",
            "Time a tool call waited for a slot of its server's maxConcurrent.",
            ["server"],
            buckets=TOOL_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.in_flight = Gauge(
            "switchboard_tool_calls_in_flight",
            "Tool calls under way, by tool server.",
            ["server"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.waiting = Gauge(
            "switchboard_tool_calls_waiting",
            "Tool calls waiting for a slot of their server's maxConcurrent.",
            ["server"],
            multiprocess_mode="livesum",
            registry=r,
        )

    def ended(self, server: str, seconds: float | None, error: str | None) -> None:
        """A call to ``server`` ended after running ``seconds`` (None: it never ran, no
        slot came) with ``error``, its kind (None: it succeeded)."""
        self.calls.labels(server).inc()
        if seconds is not None:
            self.latency.labels(server).observe(seconds)
        if error is not None:
            self.errors.labels(server, error).inc()


def multiprocess_dir() -> str | None:
    """The directory of prometheus_client's multiprocess mode when it is on, else None."""
    return os.environ.get(MULTIPROC_DIR_ENV) or None


def scrape_registry(own: CollectorRegistry) -> CollectorRegistry:
    """What a scrape of this process reads: every process of the host (multiprocess mode:
    a registry made for the scrape, as prometheus_client prescribes), else ``own``."""
    path = multiprocess_dir()
    if path is None:
        return own
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]  # untyped upstream
    return registry


def serve(metrics: Metrics, host: str, port: int) -> None:
    """Serve the process's metrics on ``host:port`` (prometheus_client's own HTTP server,
    on a daemon thread): what a worker does when ``SWITCHBOARD_METRICS_PORT`` is set."""
    start_http_server(port, addr=host, registry=scrape_registry(metrics.registry))
