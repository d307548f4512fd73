"""The Celery app: JSON, late acks, requeue on worker loss, prefetch 1, no result backend.

Run outcomes live in the run records in Redis, so tasks ignore results. Tasks are thin:
they carry ids, load state from Redis and call into ``switchboard.shared``.

Task events are on (``SWITCHBOARD_TASK_EVENTS``, default on): a run's task shows its
life in Flower (`task_events`), flow steps send Celery's own; the housekeeping sweep
sends none (its task list stays the runs').
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue  # type: ignore[attr-defined]

from switchboard import telemetry
from switchboard.shared.config import ConfigError, Settings, get_settings
from switchboard.shared.errors import InvalidInput, Unavailable
from switchboard.shared.store.urls import ClusterUrl, parse_redis_url, unix_kombu_url
from switchboard.workers.routing import (
    ALL_QUEUES,
    FLOWS_QUEUE,
    RUNS_QUEUE,
    SWEEP_QUEUE,
    TASK_ROUTES,
)
from switchboard.workers.tasks import register_tasks

__all__ = ["ALL_QUEUES", "FLOWS_QUEUE", "RUNS_QUEUE", "VISIBILITY_TIMEOUT_S", "create_celery_app"]

# Above the longest step a worker executes (a run's deadline caps at one hour), so a
# message is never redelivered while its first copy still runs.
VISIBILITY_TIMEOUT_S = 2 * 3600


def _queue(name: str, queue_type: str = "classic") -> Queue:
    """A queue with its own exchange, bound by the queue's name, so routing is exact.

    Classic: a direct exchange. Quorum (RabbitMQ): the queue declared with
    ``x-queue-type: quorum`` behind a topic exchange, because Celery sends countdown tasks
    (delivery backoff, yield wake-ups) through RabbitMQ's native delayed delivery only to
    queues whose exchange is not direct. Celery's defaults do the rest: it detects quorum
    queues (no global QoS) and declares its delay queues as quorum queues too."""
    if queue_type == "quorum":
        return Queue(  # type: ignore[no-untyped-call]
            name,
            Exchange(name, type="topic"),  # type: ignore[no-untyped-call]
            routing_key=name,
            queue_arguments={"x-queue-type": "quorum"},
        )
    return Queue(name, Exchange(name), routing_key=name)  # type: ignore[no-untyped-call]


def _kombu_broker(
    url: str, transport: dict[str, object]
) -> tuple[str, str | None, dict[str, Any] | None]:
    """The broker URL in kombu's terms, the product's transport for it, if any, and
    Celery's ``broker_use_ssl`` for a TLS sentinel group (else None).

    A ``redis+sentinel://h1:p1,h2:p2/<master>/<db>`` URL (the store's form, and the
    broker's when SWITCHBOARD_BROKER_URL is unset) becomes kombu's
    ``sentinel://h1:p1/<db>;sentinel://h2:p2/<db>`` with ``master_name`` added to the
    ``transport`` options, so workers follow a failover as the store does; over TLS
    (``rediss+sentinel://``) the sentinels are asked over TLS (``sentinel_kwargs`` in the
    ``transport`` options, with the sentinels' own password if the URL gives one) and the
    primary reached over TLS (``broker_use_ssl``). Any other
    scheme kombu does not know is refused with the forms expected, and a cluster
    (``redis+cluster://``, state only) with the broker settings that can carry the queues."""
    if url.startswith(("redis://", "rediss://")):
        return url, "switchboard.workers.transport:Transport", None
    if url.startswith("unix://"):
        return unix_kombu_url(url), "switchboard.workers.transport:Transport", None
    if url.startswith("sentinel://"):
        return url, "switchboard.workers.transport:SentinelTransport", None
    if url.startswith(("redis+", "rediss+")):
        setting = "SWITCHBOARD_BROKER_URL or SWITCHBOARD_REDIS_URL"
        parsed = parse_redis_url(url, setting)
        if isinstance(parsed, ClusterUrl):
            raise ConfigError(
                "a Redis Cluster cannot carry Celery's queues (kombu has no cluster "
                "transport): set SWITCHBOARD_BROKER_URL to redis://, redis+sentinel:// "
                "or amqp:// (docs/scaling.md)",
                key_path="SWITCHBOARD_BROKER_URL",
            )
        assert parsed is not None  # the plain forms returned above
        transport["master_name"] = parsed.master
        if parsed.sentinel_kwargs():  # TLS, or the sentinels' own password
            transport["sentinel_kwargs"] = parsed.sentinel_kwargs()
        transport_class = "switchboard.workers.transport:SentinelTransport"
        return parsed.kombu_url(), transport_class, parsed.kombu_ssl()
    return url, None, None


def create_celery_app(settings: Settings | None = None) -> Celery:
    """Build the configured Celery app with every task registered."""
    settings = settings or get_settings()
    broker = settings.effective_broker_url
    if not broker:
        raise Unavailable(
            "no Redis configured: set SWITCHBOARD_REDIS_URL (or run `switchboard up`, "
            "which starts an embedded Redis)"
        )
    transport: dict[str, object] = {
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
        "socket_keepalive": True,
        "health_check_interval": 25,
    }
    broker, transport_class, broker_ssl = _kombu_broker(broker, transport)
    if transport_class is not None:
        # No copy of each message in flight in kombu's `unacked` hash (two broker round
        # trips per message, one before the worker may start it): the product recovers
        # what a dead worker held itself (`transport.py`), long before the broker's
        # visibility timeout would.
        transport["ack_emulation"] = False
    if settings.broker_queue_type == "quorum" and not broker.startswith(("amqp", "pyamqp")):
        raise InvalidInput(
            "SWITCHBOARD_BROKER_QUEUE_TYPE=quorum needs RabbitMQ as the broker "
            "(SWITCHBOARD_BROKER_URL=amqp://…); Redis has no quorum queues"
        )
    app = Celery("switchboard", broker=broker, set_as_current=False)
    if transport_class:
        # Survives a broker restart with tasks in flight (see workers/transport.py).
        app.conf.broker_transport = transport_class
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_transport_options=transport,
        broker_use_ssl=broker_ssl,
        broker_connection_retry_on_startup=True,
        visibility_timeout=VISIBILITY_TIMEOUT_S,
        task_queues=[_queue(name, settings.broker_queue_type) for name in ALL_QUEUES],
        task_default_queue=FLOWS_QUEUE,
        task_routes=TASK_ROUTES,
        # Celery's threads pool, its threads started up front (workers/pool.py).
        worker_pool="switchboard.workers.pool:TaskPool",
        worker_send_task_events=settings.task_events,
        task_send_sent_event=False,
        worker_hijack_root_logger=False,
        beat_schedule={
            "sweep": {
                "task": "switchboard.sweep",
                "schedule": settings.sweep_interval_s,
                "options": {"queue": SWEEP_QUEUE, "expires": settings.sweep_interval_s * 4},
            }
        },
        timezone="UTC",
        # Read by `CeleryQueue`: on a Redis broker a message goes to its queue's list by
        # name (LPUSH creates it), so a publish skips kombu's declare of the queue; RabbitMQ
        # keeps it (it drops a message to an undeclared queue).
        switchboard_declare_on_publish=transport_class is None,
    )
    register_tasks(app, settings)
    telemetry.watch_celery()  # a worker or beat traces once started (an endpoint set)
    return app
