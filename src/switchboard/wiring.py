"""The composition root: builds Services for the api and the worker from settings."""

from __future__ import annotations

from switchboard.shared.config import Settings, SwitchboardConfig, get_config
from switchboard.shared.errors import Unavailable
from switchboard.shared.flows import pending
from switchboard.shared.queue import TaskQueue
from switchboard.shared.services import Services
from switchboard.shared.store import Store
from switchboard.shared.store.client import Durability
from switchboard.shared.tools.catalog import register_session_tools


def build_services(
    settings: Settings, *, queue: TaskQueue, config: SwitchboardConfig | None = None
) -> Services:
    """Wire store, config, queue, tools and flow hooks."""
    if not settings.redis_url:
        raise Unavailable("no Redis configured: set SWITCHBOARD_REDIS_URL")
    config = config or get_config(settings.config)
    store = Store.from_url(
        settings.redis_url,
        fast_paths=settings.fast_paths,
        durability=Durability(settings.redis_wait_replicas, settings.redis_wait_timeout_ms),
        prefix=settings.key_prefix,
        main_key=config.session.main_key,
        scope=config.session.scope,
        retention_s=int(config.runs.retention_hours * 3600),
        max_attempts=config.runs.max_attempts,
        lease_s=settings.lane_lease_s,
    )
    lost_after = pending.lost_after_ms(settings.lane_lease_s)
    queue = pending.PendingStepsQueue(queue, store.pending, lost_after)
    services = Services(store=store, config=config, settings=settings, queue=queue)
    register_session_tools(services.tools)
    return services
