"""The composition root: builds Services for the api and the worker from settings."""

from __future__ import annotations

import redis

from switchboard.shared.config import Settings, SwitchboardConfig, get_config
from switchboard.shared.errors import Unavailable
from switchboard.shared.flows import pending
from switchboard.shared.queue import TaskQueue
from switchboard.shared.redis_conn import DRIVER_INFO, ThreadHeldRedis
from switchboard.shared.services import Services
from switchboard.shared.store import Store
from switchboard.shared.tools.catalog import register_session_tools


def redis_client(url: str) -> redis.Redis:
    """A pooled Redis client with keepalive and health checks.

    With every connection in use (a worker with more threads than the pool holds, all
    calling at once), a caller waits up to 20 s for one instead of failing."""
    pool = redis.BlockingConnectionPool.from_url(
        url,
        socket_keepalive=True,
        health_check_interval=25,
        socket_timeout=30,
        socket_connect_timeout=5,
        max_connections=512,
        timeout=20,
        driver_info=DRIVER_INFO,
    )
    return ThreadHeldRedis.from_pool(pool)


def build_services(
    settings: Settings, *, queue: TaskQueue, config: SwitchboardConfig | None = None
) -> Services:
    """Wire store, config, queue, tools and flow hooks."""
    if not settings.redis_url:
        raise Unavailable("no Redis configured: set SWITCHBOARD_REDIS_URL")
    config = config or get_config(settings.config)
    store = Store(
        redis_client(settings.redis_url),
        prefix=settings.key_prefix,
        main_key=config.session.main_key,
        scope=config.session.scope,
        retention_s=int(config.runs.retention_hours * 3600),
        max_attempts=config.runs.max_attempts,
        lease_s=settings.lane_lease_s,
    )
    lost_after = pending.lost_after_ms(settings.lane_lease_s)
    queue = pending.PendingStepsQueue(queue, store.redis, store.ks, lost_after)
    services = Services(store=store, config=config, settings=settings, queue=queue)
    register_session_tools(services.tools)
    return services
