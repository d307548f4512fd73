"""The composition root: builds Services for the api and the worker from settings."""

from __future__ import annotations

import logging

from switchboard.shared.config import ConfigError, Settings, SwitchboardConfig, get_config
from switchboard.shared.errors import StoreUnavailable, Unavailable
from switchboard.shared.flows import pending
from switchboard.shared.queue import TaskQueue
from switchboard.shared.runtime.external_tools import ExternalTools
from switchboard.shared.services import Services
from switchboard.shared.store import Store
from switchboard.shared.store.client import connect_plain
from switchboard.shared.store.durability import Durability
from switchboard.shared.store.stats import MIN_REDIS_VERSION_TEXT, too_old
from switchboard.shared.tools.catalog import register_session_tools

log = logging.getLogger("switchboard")


def build_services(
    settings: Settings, *, queue: TaskQueue, config: SwitchboardConfig | None = None
) -> Services:
    """Wire store, config, queue, tools and flow hooks."""
    if not settings.redis_url:
        raise Unavailable("no Redis configured: set SWITCHBOARD_REDIS_URL")
    config = config or get_config(settings.config)
    store = Store.from_url(
        settings.redis_url,
        durability=Durability(settings.redis_wait_replicas, settings.redis_wait_timeout_ms),
        # Keys share slots only when cut into groups (each under its hash tag).
        slot_check=settings.slot_check and settings.groups > 1,
        prefix=settings.key_prefix,
        groups=settings.groups,
        main_key=config.session.main_key,
        scope=config.session.scope,
        retention_s=int(config.runs.retention_hours * 3600),
        max_attempts=config.runs.max_attempts,
        lease_s=settings.lane_lease_s,
    )
    _check_layout(store)
    lost_after = pending.lost_after_ms(settings.lane_lease_s)
    queue = pending.PendingStepsQueue(queue, store.pending, lost_after)
    services = Services(store=store, config=config, settings=settings, queue=queue)
    register_session_tools(services.tools)
    services.extra_tools = ExternalTools(
        config.mcp.servers, slots=store.tool_slots, metrics=services.metrics.tools
    )
    return services


def check_layout(settings: Settings) -> None:
    """At a process's start, before anything else: refuse (`ConfigError`, one line and
    exit 2 from the CLI) a store whose data is cut into other slot groups than
    ``settings`` say, writing nothing (the process records them when it builds its
    services, `build_services`, as does one that could not reach the store yet)."""
    if not settings.redis_url:
        return
    client = connect_plain(settings.redis_url, socket_timeout=3, socket_connect_timeout=3)
    try:
        store = Store(client, prefix=settings.key_prefix, groups=settings.groups)
        _check_version(store)
        _check_layout(store, record=False)
    finally:
        client.close()


def _check_version(store: Store) -> None:
    """Refuse to start on a Redis older than the store's scripts need (a store not
    reachable yet is not checked)."""
    try:
        version = store.stats.version_if_told()
    except StoreUnavailable:
        return
    if version is not None and too_old(version):
        raise ConfigError(
            f"the Redis at SWITCHBOARD_REDIS_URL is {version}: Switchboard needs Redis "
            f"{MIN_REDIS_VERSION_TEXT} or newer",
            key_path="SWITCHBOARD_REDIS_URL",
        )


def _check_layout(store: Store, *, record: bool = True) -> None:
    """Refuse to start on a store whose data is cut into other slot groups than this
    process's (``SWITCHBOARD_SLOT_GROUPS``); a store not reachable yet is checked by the
    first process that reaches it."""
    try:
        recorded = store.layout_groups(record=record)
    except StoreUnavailable as exc:
        log.warning("slot groups not checked (the store is not reachable: %s)", exc)
        return
    if recorded != store.ks.groups:
        raise ConfigError(
            f"the store's data is cut into {recorded} slot groups, this process into "
            f"{store.ks.groups}: set SWITCHBOARD_SLOT_GROUPS={recorded} (the groups are "
            "fixed for the life of the data)",
            key_path="SWITCHBOARD_SLOT_GROUPS",
        )
