"""The store's Redis clients, made from a URL: the one place a Redis error becomes ours.

Every command and pipeline the store sends goes through `StoreRedis` (sync) or
`AsyncStoreRedis` (the api's event loop), or their cluster twins (`cluster`). A redis-py
error raised there (the server is down, loading, timed out, refused the command) is
raised again as `StoreUnavailable`, ``from`` the original, so nothing above the store
catches a redis-py exception. Two are let through as they are, because redis-py's own
helpers act on them: ``NoScriptError`` (a script not yet loaded: `Script` loads it and
runs it again) and ``WatchError`` (an optimistic transaction that lost its race). The rule
is kept in `redis_errors`.

Every client is made from a URL in this module (`connect`, `connect_plain`,
`connect_async`), in any form `store.urls` reads: redis-py's own client on redis-py's
blocking pool (a caller waits up to 20 s for a free connection instead of failing). A
``redis+sentinel://`` URL gives the same client classes on a sentinel pool that follows
its primary (`sentinel`); a ``redis+cluster://`` (or ``rediss+cluster://``) URL gives
redis-py's `RedisCluster` with the same rules (`cluster`).

The store's client (`connect`) loads every store script on each connection as it
connects (redis-py's ``redis_connect_func`` hook, `load_scripts_on_connect`), so its
pipelines run scripts without asking the server first whether it knows them (redis-py
sends ``SCRIPT EXISTS`` before every such pipeline): whatever server a connection reaches
(after a restart, a failover) it reaches with the scripts loaded. A script missing all
the same (a ``SCRIPT FLUSH`` on a live server) fails its pipeline with `StoreUnavailable`
(its other commands may have run: the store's steps are retried and idempotent) and
loads every script again. Acknowledged writes (WAIT for replicas) are in `durability`.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from switchboard.shared.store.cluster import (
    ClusterStoreRedis,
    async_cluster_client,
    cluster_client,
)
from switchboard.shared.store.driver import DRIVER_INFO
from switchboard.shared.store.durability import NO_WAIT, Durability, acknowledged_call
from switchboard.shared.store.lua_scripts import all_shas, all_sources, load_on
from switchboard.shared.store.redis_errors import PASSED_THROUGH as _PASSED_THROUGH
from switchboard.shared.store.redis_errors import unavailable as unavailable
from switchboard.shared.store.sentinel import (
    AsyncSentinelBlockingPool,
    SentinelBlockingPool,
    async_sentinels,
    sentinels,
)
from switchboard.shared.store.slots import check_one_slot, check_script, command_keys
from switchboard.shared.store.urls import ClusterUrl, parse_redis_url, plain_url_options


class StorePipeline(redis.client.Pipeline):
    """A pipeline whose failed ``execute`` raises `StoreUnavailable`; with `Durability`
    on, one that queued an acknowledged write ends with WAIT on its connection (not in a
    transaction: the store's acknowledged writes are never in one)."""

    store: StoreRedis
    transactional = True  # as made (redis-py's own flag shares a method's name)
    # A shortfall raises `NotReplicated` (set for a single refused write, `StoreRedis`).
    refuse_short = False
    _acknowledged = False

    def pipeline_execute_command(self, *args: Any, **options: Any) -> StorePipeline:
        """Queue a command, noting an acknowledged write."""
        if self.store.durability.acknowledged(args):
            self._acknowledged = True
        if self.store.slot_check:
            check_script(args)
        super().pipeline_execute_command(*args, **options)
        return self

    def load_scripts(self) -> None:
        """Nothing to ask for the store's scripts on a client whose connections load them
        (see the module); any other script is checked and loaded as redis-py does."""
        mine = self.store.scripts_on_connect
        if not mine or any(script.sha not in all_shas() for script in self.scripts):
            super().load_scripts()  # type: ignore[no-untyped-call]

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands (and WAIT); a Redis error is raised as `StoreUnavailable`."""
        transaction = self.transactional or self.explicit_transaction
        waits, self._acknowledged = self._acknowledged and not transaction, False
        if transaction and self.store.slot_check:
            keys = [key for args, _ in self.command_stack for key in command_keys(args)]
            check_one_slot("transaction", keys)
        try:
            if not waits:
                return self.store.checked(super().execute(raise_on_error))
            self.pipeline_execute_command(*self.store.durability.wait_args())
            replies = self.store.checked(super().execute(False))
            self.store.durability.confirmed(replies.pop(), refuse=self.refuse_short)
            if raise_on_error:  # a command that failed: its error, as redis-py raises it
                for reply in replies:
                    if isinstance(reply, Exception):
                        raise reply
            return replies
        except NoScriptError as exc:
            self.store.load_store_scripts()
            raise unavailable(exc) from exc
        except _PASSED_THROUGH:
            raise
        except redis.RedisError as exc:
            raise unavailable(exc) from exc
        finally:
            self.refuse_short = False


class StoreRedis(redis.Redis):
    """The store's sync client on one Redis (or a Sentinel group's primary): its
    commands raise `StoreUnavailable` for a Redis error, its acknowledged writes are
    confirmed on replicas by its `Durability` (``durability``), and with ``slot_check``
    its scripts and transactions must each name keys of one hash slot (`CrossSlotError`)."""

    durability: Durability = NO_WAIT
    slot_check = False
    # Its connections load every store script as they connect (`load_scripts_on_connect`).
    scripts_on_connect = False

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Run one command; a Redis error is raised as `StoreUnavailable`. An acknowledged
        write goes out with WAIT when `Durability` is on."""
        if self.slot_check:
            check_script(args)
        if self.durability.acknowledged(args):
            return acknowledged_call(self, args, options)
        try:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except _PASSED_THROUGH:
            raise
        except redis.RedisError as exc:
            raise unavailable(exc) from exc

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> StorePipeline:
        """A pipeline on this client's pool that translates its errors too."""
        pipe = StorePipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.store = self
        pipe.transactional = transaction
        return pipe

    def load_store_scripts(self) -> None:
        """Load every store script on the server (one round trip); a failure is left to
        the next command to meet."""
        pipe = redis.client.Pipeline(self.connection_pool, self.response_callbacks, False, None)
        for source in all_sources():
            pipe.script_load(source)
        with contextlib.suppress(redis.RedisError):
            pipe.execute()

    def checked(self, replies: list[Any]) -> list[Any]:
        """``replies`` as they are; a script the server lacked is loaded again."""
        if any(isinstance(reply, NoScriptError) for reply in replies):
            self.load_store_scripts()
        return replies


def load_scripts_on_connect(conn: redis.connection.AbstractConnection) -> None:
    """redis-py's connect handshake, then every store script loaded on the connection's
    server (one round trip)."""
    conn.on_connect()  # type: ignore[no-untyped-call]
    load_on(conn)


# The store's pool: keepalive and health checks, and a wait for a free connection.
_POOL_OPTIONS: dict[str, Any] = {
    "socket_keepalive": True,
    "health_check_interval": 25,
    "socket_timeout": 30,
    "socket_connect_timeout": 5,
    "max_connections": 512,
    "timeout": 20,
    "driver_info": DRIVER_INFO,
}


def connect(url: str, *, durability: Durability = NO_WAIT, slot_check: bool = False) -> redis.Redis:
    """The store's sync client for ``url`` (see the module): its acknowledged writes
    confirmed on replicas as ``durability`` says; with ``slot_check`` its scripts and
    transactions must each name keys of one hash slot (`CrossSlotError`; always on a
    cluster)."""
    parsed = parse_redis_url(url)
    if isinstance(parsed, ClusterUrl):
        return as_redis(cluster_client(parsed, dict(_POOL_OPTIONS), durability=durability))
    pool_options = {**_POOL_OPTIONS, "redis_connect_func": load_scripts_on_connect}
    if parsed is None:
        options = plain_url_options(url, pool_options)
        pool: redis.ConnectionPool = redis.BlockingConnectionPool.from_url(url, **options)
    else:
        options = {**parsed.connection_kwargs(), **pool_options, "is_master": True}
        pool = SentinelBlockingPool(parsed.master, sentinels(parsed), **options)
    client = cast(StoreRedis, StoreRedis.from_pool(pool))
    client.durability = durability
    client.slot_check = slot_check
    client.scripts_on_connect = True
    return client


def as_redis(client: ClusterStoreRedis) -> redis.Redis:
    """The cluster client, typed as redis-py's `Redis`: the store's classes call the
    commands both offer alike (redis-py types the two apart)."""
    return cast(redis.Redis, client)


def dedicated_connection(client: redis.Redis, key: str | None = None) -> redis.Connection:
    """A connection of its own (not from the pool) to where ``client``'s pool connects:
    the same server, database and credentials; for a sentinel pool, the current primary;
    for a cluster, the primary that owns ``key``'s slot."""
    if isinstance(client, ClusterStoreRedis):
        client = client.node_client(key)
    pool = client.connection_pool
    return cast(redis.Connection, pool.connection_class(**pool.connection_kwargs))


def connect_plain(url: str, **options: Any) -> redis.Redis:
    """A plain store client with its own connection options (a probe, a broker's lists)."""
    parsed = parse_redis_url(url)
    if parsed is None:
        options = plain_url_options(url, options)
        return cast(StoreRedis, StoreRedis.from_url(url, driver_info=DRIVER_INFO, **options))
    options = {"driver_info": DRIVER_INFO, **options}
    if isinstance(parsed, ClusterUrl):
        return as_redis(cluster_client(parsed, options))
    return cast(
        StoreRedis,
        sentinels(parsed).master_for(
            parsed.master,
            redis_class=StoreRedis,
            connection_pool_class=SentinelBlockingPool,
            **options,
        ),
    )


class AsyncStorePipeline(aioredis.client.Pipeline):
    """An async pipeline whose failed ``execute`` raises `StoreUnavailable`."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands; a Redis error is raised as `StoreUnavailable`."""
        try:
            return await super().execute(raise_on_error)
        except _PASSED_THROUGH:
            raise
        except redis.RedisError as exc:
            raise unavailable(exc) from exc


class AsyncStoreRedis(aioredis.Redis):
    """The api's async store client; its commands raise `StoreUnavailable` for a Redis error."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Run one command; a Redis error is raised as `StoreUnavailable`."""
        try:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except _PASSED_THROUGH:
            raise
        except redis.RedisError as exc:
            raise unavailable(exc) from exc

    def pipeline(
        self, transaction: bool = True, shard_hint: str | None = None
    ) -> AsyncStorePipeline:
        """A pipeline on this client's pool that translates its errors too."""
        return AsyncStorePipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )


# The api's async client for any URL (`connect_async`): typed as redis-py's async client,
# whose commands its async `RedisCluster` offers alike (`as_redis`).
AsyncStoreClient = aioredis.Redis

# What every async pool is made with: a blocking one with the sync pool's size and wait
# (`_POOL_OPTIONS`): redis-py's default async pool holds 100 connections and fails the
# 101st command under way at once ("Too many connections"), so an api serving a few
# hundred waits at once answered some of them 503 with Redis idle. A task now waits for a
# free connection.
_ASYNC_POOL_OPTIONS: dict[str, Any] = {
    "driver_info": DRIVER_INFO,
    "max_connections": _POOL_OPTIONS["max_connections"],
    "timeout": _POOL_OPTIONS["timeout"],
}


def connect_async(url: str, **options: Any) -> AsyncStoreClient:
    """An async store client for ``url`` with the connection ``options`` given (for a
    sentinel URL, on a sentinel pool following its primary on the event loop; for a
    cluster URL, redis-py's async `RedisCluster`)."""
    parsed = parse_redis_url(url)
    if parsed is None:
        options = {**_ASYNC_POOL_OPTIONS, **plain_url_options(url, options)}
        pool = aioredis.BlockingConnectionPool.from_url(url, **options)
        return cast(AsyncStoreRedis, AsyncStoreRedis.from_pool(pool))
    options = {**_ASYNC_POOL_OPTIONS, **options}
    if isinstance(parsed, ClusterUrl):
        return cast(aioredis.Redis, async_cluster_client(parsed, options))
    client = async_sentinels(parsed, AsyncRetry(NoBackoff(), 0)).master_for(
        parsed.master,
        redis_class=AsyncStoreRedis,
        connection_pool_class=AsyncSentinelBlockingPool,
        **options,
    )
    return cast(AsyncStoreRedis, client)
