"""`GET /metrics`: cluster-wide Prometheus metrics, read from Redis at scrape time.

Every api process answers with the same numbers: counters come from the metrics hash that
every worker and api adds to (``shared/metrics.py``), gauges from the store (parked and
active runs) and from the broker (the length of each Celery queue). One scrape is two
round trips: one pipeline on the store, one on the broker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Request, Response
from kombu.transport.redis import PRIORITY_STEPS, Channel
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool

from switchboard.api.auth import require_token
from switchboard.shared import metrics as m
from switchboard.shared.services import Services
from switchboard.shared.store.counters import ListLengths
from switchboard.shared.store.run_records import LEDGER_TERMINAL, ledger_state
from switchboard.workers.app import ALL_QUEUES

router = APIRouter()

_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")


class SwitchboardCollector(Collector):
    """Collects the cluster's metrics from Redis on every scrape."""

    def __init__(self, svc: Services, broker: ListLengths | None) -> None:
        self.svc = svc
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        """The metric families, read now."""
        snap = self.svc.store.counters.snapshot()
        counters = m.read_counters(snap.counters)
        yield from _run_families(counters)
        yield from _flow_families(counters)
        yield _gauge(
            "switchboard_parked_runs", "Runs parked on a wait (sessions_send).", snap.parked_runs
        )
        yield _gauge("switchboard_active_runs", "Runs started and not ended.", snap.active_runs)
        if self.broker is not None:
            depths = GaugeMetricFamily(
                "switchboard_queue_depth", "Messages waiting in a Celery queue.", labels=["queue"]
            )
            for queue, depth in queue_depths(self.broker).items():
                depths.add_metric([queue], depth)
            yield depths


def _run_families(counters: dict[str, int]) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "switchboard_runs_started", "Agent runs started.", value=counters.get(m.RUNS_STARTED, 0)
    )
    ended = CounterMetricFamily(
        "switchboard_runs_ended", "Agent runs ended, by status.", labels=["status"]
    )
    for (status, *_), value in sorted(m.labelled(counters, m.RUNS_ENDED).items()):
        ended.add_metric([status], value)
    yield ended
    yield _ledger_family(counters)
    per_bucket = {
        labels[0]: value for labels, value in m.labelled(counters, m.RUN_DURATION_LE).items()
    }
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for bound_ms in m.RUN_DURATION_BUCKETS_MS:
        cumulative += per_bucket.get(str(bound_ms), 0)
        buckets.append((_seconds_text(bound_ms), cumulative))
    buckets.append(("+Inf", cumulative + per_bucket.get("+Inf", 0)))
    yield HistogramMetricFamily(
        "switchboard_run_duration_seconds",
        "Agent run duration from the first claim to the end (parked time included).",
        buckets=buckets,
        sum_value=counters.get(m.RUN_DURATION_SUM_MS, 0) / 1000,
    )


def _ledger_family(counters: dict[str, int]) -> Metric:
    """Ended runs by run ledger state (every terminal state, 0 when none ended so)."""
    by_state: Counter[str] = Counter()
    for (status, *_), value in m.labelled(counters, m.RUNS_ENDED).items():
        by_state[ledger_state(status)] += value
    family = CounterMetricFamily(
        "switchboard_runs_terminal",
        "Agent runs ended, by run ledger state (succeeded, failed, timed_out, cancelled, lost).",
        labels=["state"],
    )
    for state in sorted({*LEDGER_TERMINAL, *by_state}):
        family.add_metric([state], by_state.get(state, 0))
    return family


def _flow_families(counters: dict[str, int]) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "switchboard_a2a_rounds",
        "Reply-back rounds started after a sessions_send.",
        value=counters.get(m.A2A_ROUNDS, 0),
    )
    announces = CounterMetricFamily(
        "switchboard_announces",
        "Announces settled, by kind (subagent, a2a) and outcome.",
        labels=["kind", "outcome"],
    )
    for labels, value in sorted(m.labelled(counters, m.ANNOUNCES).items()):
        if len(labels) == 2:
            announces.add_metric(list(labels), value)
    yield announces
    deliveries = CounterMetricFamily(
        "switchboard_deliveries",
        "Delivery attempts settled, by outcome (delivered, failed, denied, retry).",
        labels=["outcome"],
    )
    for (outcome, *_), value in sorted(m.labelled(counters, m.DELIVERIES).items()):
        deliveries.add_metric([outcome], value)
    yield deliveries


def _gauge(name: str, documentation: str, value: Any) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=int(value))


def _seconds_text(ms: int) -> str:
    """A bucket bound in seconds as Prometheus writes it (`0.1`, `1.0`, `60.0`)."""
    return repr(ms / 1000)


def queue_depths(broker: ListLengths) -> dict[str, int]:
    """Messages waiting per Celery queue: kombu keeps one list per priority step."""
    lists = {
        queue: [queue if p == 0 else f"{queue}{Channel.sep}{p}" for p in PRIORITY_STEPS]
        for queue in ALL_QUEUES
    }
    lengths = iter(broker.read([name for names in lists.values() for name in names]))
    return {queue: sum(next(lengths) for _ in names) for queue, names in lists.items()}


def _broker_lists(svc: Services) -> ListLengths | None:
    """The broker's lists: on the store's client when they share a Redis, None if not Redis."""
    url = svc.settings.effective_broker_url
    if not url or url == svc.settings.redis_url:
        return svc.store.list_lengths
    if urlsplit(url).scheme not in _REDIS_SCHEMES:
        return None
    return ListLengths.from_url(url)


def _registry(request: Request) -> CollectorRegistry:
    """The app's registry, built on the first scrape (services exist only after startup)."""
    registry: CollectorRegistry | None = getattr(request.app.state, "metrics_registry", None)
    if registry is None:
        svc: Services = request.app.state.services
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SwitchboardCollector(svc, _broker_lists(svc)))
        request.app.state.metrics_registry = registry
    return registry


@router.get(
    "/metrics",
    dependencies=[Depends(require_token)],
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_PLAIN_0_0_4: {}}}},
)
async def metrics(request: Request) -> Response:
    """Cluster-wide metrics in the Prometheus text format."""
    body = await run_in_threadpool(generate_latest, _registry(request))
    return Response(content=body, media_type=CONTENT_TYPE_PLAIN_0_0_4)
