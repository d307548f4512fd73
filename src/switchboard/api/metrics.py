"""`GET /metrics`: this process's Prometheus counters and the cluster's gauges.

The counters are the api process's own (`shared.metrics`: the runs it cancelled, the
deliveries it settled...); each worker serves its own on ``SWITCHBOARD_METRICS_PORT``, and
Prometheus sums them. With prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``,
set by ``switchboard up``) a scrape sums every process of the host. The gauges are read at
scrape time, the same from any api: the store's (runs parked, lanes held) and the broker's
(the length of each Celery queue), two round trips.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Request, Response
from kombu.transport.redis import PRIORITY_STEPS, Channel
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool

from switchboard.api.auth import require_token
from switchboard.shared.metrics import scrape_registry
from switchboard.shared.services import Services
from switchboard.shared.store.gauges import ListLengths
from switchboard.workers.app import ALL_QUEUES

router = APIRouter()

_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")


class GaugeCollector(Collector):
    """Reads the cluster's gauges from Redis on every scrape."""

    def __init__(self, svc: Services, broker: ListLengths | None) -> None:
        self.svc = svc
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        """The gauges, read now."""
        gauges = self.svc.store.gauges.read()
        yield _gauge(
            "switchboard_parked_runs", "Runs parked on a wait (sessions_send).", gauges.parked_runs
        )
        yield _gauge(
            "switchboard_active_runs",
            "Runs holding their session's lane: running, parked, or handed the lane and "
            "about to be claimed.",
            gauges.active_runs,
        )
        if self.broker is not None:
            depths = GaugeMetricFamily(
                "switchboard_queue_depth", "Messages waiting in a Celery queue.", labels=["queue"]
            )
            for queue, depth in queue_depths(self.broker).items():
                depths.add_metric([queue], depth)
            yield depths


def _gauge(name: str, documentation: str, value: Any) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=int(value))


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


def _gauges(request: Request) -> GaugeCollector:
    """The app's gauge collector, made on the first scrape (services exist only after
    startup)."""
    gauges: GaugeCollector | None = getattr(request.app.state, "metrics_gauges", None)
    if gauges is None:
        svc: Services = request.app.state.services
        gauges = GaugeCollector(svc, _broker_lists(svc))
        request.app.state.metrics_gauges = gauges
    return gauges


def _scrape(request: Request) -> bytes:
    """One scrape: the process's counters (the host's, in multiprocess mode), then the
    gauges."""
    svc: Services = request.app.state.services
    gauges = CollectorRegistry(auto_describe=False)
    gauges.register(_gauges(request))
    return generate_latest(scrape_registry(svc.metrics.registry)) + generate_latest(gauges)


@router.get(
    "/metrics",
    dependencies=[Depends(require_token)],
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_PLAIN_0_0_4: {}}}},
)
async def metrics(request: Request) -> Response:
    """This process's counters and the cluster's gauges, in the Prometheus text format."""
    body = await run_in_threadpool(_scrape, request)
    return Response(content=body, media_type=CONTENT_TYPE_PLAIN_0_0_4)
