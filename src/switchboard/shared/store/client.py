"""The store's Redis clients, made from a URL: the one place a Redis error becomes ours.

Every command and pipeline the store sends goes through `StoreRedis` (sync) or
`AsyncStoreRedis` (the api's event loop). A redis-py error raised there (the server is
down, loading, timed out, refused the command) is raised again as `StoreUnavailable`,
``from`` the original, so nothing above the store catches a redis-py exception. Two are
let through as they are, because redis-py's own helpers act on them: ``NoScriptError``
(a script not yet loaded: `Script` loads it and runs it again) and ``WatchError`` (an
optimistic transaction that lost its race). The rule is kept in `redis_errors`.

Every client is made from a URL in this module (`connect`, `connect_plain`,
`connect_async`, `blocking_pool`), in any form `store.urls` reads. A
``redis+sentinel://`` URL gives the same client classes on a pool whose connections ask
the sentinels where the primary is each time they connect (redis-py's
`SentinelConnectionPool`): a connection to a primary that died fails its command (the
caller sees `StoreUnavailable`, the api a 503) and reconnects to the promoted replica; one
to a primary that was demoted is closed by its first write (READONLY) and reconnects too.
The fast path (`ThreadHeldRedis`) runs on such a pool as it is: its held connections are
the pool's sentinel-managed ones, reconnected the same way.

A ``redis+cluster://`` (or ``rediss+cluster://``) URL gives a router
(`router.ClusterStoreRedis`, `router.AsyncClusterStoreRedis`) over the same client
classes, one per primary, each on a pool of its own made with the same options (the fast
path, `Durability`, ``slot_check``, the URL's TLS options): every command goes to the
primary that owns its key's slot, so the store's keys may carry different hash tags and
spread over every shard. ``store/router.py`` says how commands and pipelines are split,
``store/cluster.py`` how the slots' owners are found and followed through a failover.

How a Sentinel group's primary is found and followed is in `sentinel`; acknowledged writes
(WAIT for replicas) in `durability`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis._parsers import Encoder  # redis.connection uses it without exporting it
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, ResponseError
from redis.maint_notifications import MaintNotificationsConfig

from switchboard.shared.store.cluster import (
    AsyncNodeConnection,
    AsyncSSLNodeConnection,
    ClusterMap,
    NodeClients,
    NodeConnection,
    SSLNodeConnection,
    follow_cluster,
)
from switchboard.shared.store.driver import DRIVER_INFO
from switchboard.shared.store.durability import NO_WAIT, Durability
from switchboard.shared.store.follow import FOLLOWER_JOIN_S, Follower, cut_connections
from switchboard.shared.store.lua_scripts import load as load_lua
from switchboard.shared.store.lua_scripts import script_names
from switchboard.shared.store.redis_errors import PASSED_THROUGH as _PASSED_THROUGH
from switchboard.shared.store.redis_errors import unavailable as unavailable
from switchboard.shared.store.router import AsyncClusterStoreRedis, ClusterStoreRedis
from switchboard.shared.store.sentinel import (
    AsyncNewestSentinel,
    AsyncSentinelBlockingPool,
    SentinelBlockingPool,
    follow_primary,
    sentinel_kwargs,
    sentinels,
)
from switchboard.shared.store.slots import SCRIPT_COMMANDS as _SCRIPTS
from switchboard.shared.store.slots import CrossSlotError as CrossSlotError
from switchboard.shared.store.slots import check_one_slot as check_one_slot
from switchboard.shared.store.slots import command_keys as command_keys
from switchboard.shared.store.thread_held import ThreadHeldRedis
from switchboard.shared.store.urls import (
    ClusterUrl,
    parse_redis_url,
    plain_url_options,
)

log = logging.getLogger("switchboard.store")


def load_scripts_on_connect(conn: redis.connection.AbstractConnection) -> None:
    """redis-py's connect handshake, then every store script loaded on the connection's
    server (pipelined: one round trip). A fast-path pool connects with it, so a store
    pipeline may run scripts without asking first (`StorePipeline.scripts_loaded`):
    whatever server a connection reaches (after a restart, a failover), it reaches it with
    the scripts loaded."""
    conn.on_connect()  # type: ignore[no-untyped-call]
    sources = _script_sources()
    for source in sources:
        conn.send_command("SCRIPT", "LOAD", source)  # type: ignore[no-untyped-call]
    for _ in sources:
        conn.read_response()


@functools.cache
def _script_sources() -> tuple[str, ...]:
    """Every store script's source, as `lua_scripts` registers it (the same SHA)."""
    return tuple(load_lua(name).source for name in script_names())


class StorePipeline(redis.client.Pipeline):
    """A pipeline whose failed ``execute`` raises `StoreUnavailable`; with `Durability`
    on, one that queued an acknowledged write ends with WAIT on its connection.

    redis-py asks the server whether a pipeline's scripts are loaded (``SCRIPT EXISTS``)
    before every pipeline that runs one: a round trip of its own, as many as the pipelines
    in a sub-agent's announce. On a pool whose connections load every script as they
    connect (`load_scripts_on_connect`, the fast path) ``scripts_loaded`` skips it. A
    ``NOSCRIPT`` can then come only from a ``SCRIPT FLUSH`` on a live server: the pool's
    connections are dropped (each reconnects and loads the scripts again) and the pipeline
    raises `StoreUnavailable` (with ``raise_on_error=False`` the reply stays in its place,
    the pool's connections dropped all the same); its other commands may have run, and the
    store's steps are retried and idempotent."""

    durability: Durability = NO_WAIT
    scripts_loaded = False
    slot_check = False
    _acknowledged = False
    # A shortfall raises `NotReplicated` (set for a single refused write, see `_Translating`).
    refuse_short = False

    def pipeline_execute_command(self, *args: Any, **options: Any) -> StorePipeline:
        """Queue a command, noting an acknowledged write."""
        if self.durability.acknowledged(args):
            self._acknowledged = True
        if self.slot_check and str(args[0]).upper() in _SCRIPTS:
            check_one_slot(f"script {args[1]}", command_keys(args))
        super().pipeline_execute_command(*args, **options)
        return self

    def load_scripts(self) -> None:
        """redis-py's check and load of this pipeline's scripts, unless its connections
        loaded every script as they connected."""
        if not self.scripts_loaded:
            super().load_scripts()  # type: ignore[no-untyped-call]

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands; a Redis error is raised as `StoreUnavailable`."""
        unasked = self.scripts_loaded and bool(self.scripts)  # scripts run without asking
        try:
            replies: list[Any] = super().execute(raise_on_error)
            if unasked and any(isinstance(r, NoScriptError) for r in replies):
                self.connection_pool.disconnect()  # left in place (not raised): as below
            return replies
        except NoScriptError as exc:
            if not unasked:
                raise  # redis-py's own path: `Script` loads it and runs it again
            self.connection_pool.disconnect()  # flushed: reconnect, loading them again
            raise unavailable(exc) from exc
        except _PASSED_THROUGH:
            raise
        except redis.RedisError as exc:
            raise unavailable(exc) from exc
        finally:
            self._acknowledged = self.refuse_short = False

    def _execute_pipeline(self, connection: Any, commands: Any, raise_on_error: bool) -> Any:
        """The queued commands, then (with an acknowledged write among them) WAIT, in one
        round trip on one connection."""
        if not self._acknowledged:
            return super()._execute_pipeline(connection, commands, raise_on_error)  # type: ignore[no-untyped-call]
        waited = [*commands, (self.durability.wait_args(), {})]
        replies = super()._execute_pipeline(connection, waited, False)  # type: ignore[no-untyped-call]
        waited_reply = replies.pop()
        if raise_on_error:  # a command that failed wrote nothing to confirm: its error first
            self.raise_first_error(commands, replies)  # type: ignore[no-untyped-call]
        self.durability.confirmed(waited_reply, refuse=self.refuse_short)
        return replies

    def _execute_transaction(self, connection: Any, commands: Any, raise_on_error: bool) -> Any:
        """A transaction, then (with an acknowledged write in it) WAIT after its EXEC."""
        if self.slot_check:
            keys = [k for args, _ in commands for k in command_keys(args)]
            check_one_slot("transaction", keys)
        replies = super()._execute_transaction(connection, commands, raise_on_error)
        if self._acknowledged:
            connection.send_command(*self.durability.wait_args())
            try:
                self.durability.confirmed(connection.read_response())
            except ResponseError as exc:
                self.durability.confirmed(exc)
        return replies


class _Translating(redis.Redis):
    """A client whose commands raise `StoreUnavailable` for a Redis error, and whose
    acknowledged writes are confirmed on replicas by its `Durability` (``durability``)."""

    durability: Durability = NO_WAIT
    # Its pool's connections load every script as they connect (the fast path).
    scripts_loaded = False
    # What follows its pool's primary (a Sentinel group's); stopped on close.
    following: Follower | None = None
    # Refuse scripts and transactions whose keys span hash slots (`CrossSlotError`).
    slot_check = False

    def close(self) -> None:
        """Close the client's connections and stop following its pool's primary."""
        if self.following is not None:
            self.following.stop(join_s=FOLLOWER_JOIN_S)
        super().close()

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Run one command; a Redis error is raised as `StoreUnavailable`. An acknowledged
        write goes out with WAIT when `Durability` is on."""
        if self.slot_check and str(args[0]).upper() in _SCRIPTS:
            check_one_slot(f"script {args[1]}", command_keys(args))
        if self.durability.acknowledged(args):
            pipe = self.pipeline(transaction=False)
            pipe.refuse_short = self.durability.refuses(args)
            pipe.execute_command(*args, **options)  # type: ignore[no-untyped-call]
            return pipe.execute()[0]
        try:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except _PASSED_THROUGH:
            raise
        except redis.RedisError as exc:
            raise unavailable(exc) from exc

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> StorePipeline:
        """A pipeline on this client's pool that translates its errors too."""
        pipe = StorePipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.durability = self.durability
        pipe.scripts_loaded = self.scripts_loaded
        pipe.slot_check = self.slot_check
        return pipe


class StoreRedis(_Translating):
    """The plain store client: redis-py's own path, a pooled connection per command."""


class HeldStoreRedis(_Translating, ThreadHeldRedis):
    """The fast-path store client: each thread's commands on its own connection; its
    connections load every script as they connect, so its pipelines never ask first."""

    scripts_loaded = True


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


def blocking_pool(
    url: str, *, scripts_on_connect: bool = False
) -> tuple[redis.BlockingConnectionPool, Follower | None]:
    """A pool with keepalive and health checks for the store's client, and what follows
    its primary (none for one Redis).

    With every connection in use (a worker with more threads than the pool holds, all
    calling at once), a caller waits up to 20 s for one instead of failing. For a
    ``redis+sentinel://`` URL the pool's connections go to the primary the sentinels name.
    A cluster has a pool per node, made by its client (`connect`): a cluster URL raises
    ValueError. With ``scripts_on_connect`` each connection loads every store script as it
    connects (`load_scripts_on_connect`)."""
    parsed = parse_redis_url(url)
    pool_options = _pool_options(scripts_on_connect)
    if parsed is None:
        options = plain_url_options(url, pool_options)
        return redis.BlockingConnectionPool.from_url(url, **options), None
    if isinstance(parsed, ClusterUrl):
        raise ValueError("a Redis Cluster has a pool per node: make its client with connect()")
    options = {**parsed.connection_kwargs(), **pool_options, "is_master": True}
    pool = SentinelBlockingPool(parsed.master, sentinels(parsed), **options)  # type: ignore[no-untyped-call]
    return pool, follow_primary(pool)


def _pool_options(scripts_on_connect: bool) -> dict[str, Any]:
    """`_POOL_OPTIONS`, with each connection loading the store's scripts as it connects."""
    if not scripts_on_connect:
        return dict(_POOL_OPTIONS)
    return {**_POOL_OPTIONS, "redis_connect_func": load_scripts_on_connect}


# The store's sync client for any URL (`connect`): on one pool (one Redis, a sentinel
# group's primary), thread-held or plain, or a cluster's router over such clients.
SyncStoreClient = StoreRedis | HeldStoreRedis | ClusterStoreRedis


def connect(
    url: str,
    *,
    fast_paths: bool = True,
    durability: Durability = NO_WAIT,
    slot_check: bool = False,
) -> SyncStoreClient:
    """The store's sync client for ``url``: thread-held connections with ``fast_paths``,
    redis-py's plain pooled client without (both on a sentinel pool for a sentinel URL;
    for a cluster URL, one such client per node behind a `ClusterStoreRedis`); its
    acknowledged writes confirmed on replicas as ``durability`` says; with ``slot_check``
    its scripts and transactions must each name keys of one hash slot (`CrossSlotError`)."""
    client_class = HeldStoreRedis if fast_paths else StoreRedis
    parsed = parse_redis_url(url)
    if isinstance(parsed, ClusterUrl):
        options = _pool_options(fast_paths)
        return _cluster_client(
            parsed,
            functools.partial(_configured, client_class, durability, slot_check),
            redis.BlockingConnectionPool,
            options,
        )
    pool, following = blocking_pool(url, scripts_on_connect=fast_paths)
    client = _configured(client_class, durability, slot_check, pool)
    client.following = following
    return client


def _configured(
    client_class: type[StoreRedis] | type[HeldStoreRedis],
    durability: Durability,
    slot_check: bool,
    pool: redis.ConnectionPool,
) -> StoreRedis | HeldStoreRedis:
    """A ``client_class`` client on ``pool`` with ``durability`` and ``slot_check``."""
    # redis-py types its constructors as returning Redis; they return the class called on.
    client = cast(StoreRedis | HeldStoreRedis, client_class.from_pool(pool))
    client.durability = durability
    client.slot_check = slot_check
    return client


def _cluster_client(
    parsed: ClusterUrl,
    make_client: Callable[[Any], redis.Redis],
    pool_class: type[redis.ConnectionPool],
    options: dict[str, Any],
) -> ClusterStoreRedis:
    """A router over a store client per node (``make_client(pool)``), each on a
    ``pool_class`` pool of its own with ``options``, and what follows the primaries."""
    cluster_map = ClusterMap(parsed)
    connection_class = SSLNodeConnection if parsed.tls else NodeConnection

    def node_client(host: str, port: int) -> redis.Redis:
        kwargs = _node_kwargs(parsed, cluster_map, host, port, options)
        return make_client(pool_class(connection_class=connection_class, **kwargs))

    nodes = NodeClients(cluster_map, node_client)
    router = ClusterStoreRedis(nodes, _encoder(options))
    router.following = follow_cluster(nodes, cut_connections)
    return router


def _node_kwargs(
    parsed: ClusterUrl, cluster_map: ClusterMap, host: str, port: int, options: dict[str, Any]
) -> dict[str, Any]:
    """What a node's pool makes its connections with: the node's address, the map they
    report a stale answer to, the URL's credentials and TLS options, and ``options``."""
    return {
        "host": host,
        "port": port,
        "cluster_map": cluster_map,
        **parsed.connection_kwargs(),
        **options,
    }


def _encoder(options: dict[str, Any]) -> Encoder:
    """The encoder redis-py's pools make from the same ``options``."""
    return Encoder(  # type: ignore[no-untyped-call]
        options.get("encoding", "utf-8"),
        options.get("encoding_errors", "strict"),
        options.get("decode_responses", False),
    )


def dedicated_connection(client: redis.Redis, key: str | None = None) -> redis.Connection:
    """A connection of its own (not from the pool) to where ``client``'s pool connects:
    the same server, database and credentials; for a sentinel pool, the current primary;
    for a cluster, the primary that owns ``key``'s slot."""
    if isinstance(client, ClusterStoreRedis):
        client = client.client_for(key)
    pool = client.connection_pool
    return cast(redis.Connection, pool.connection_class(**pool.connection_kwargs))


def connect_plain(url: str, **options: Any) -> StoreRedis | ClusterStoreRedis:
    """A plain store client with its own connection options (a probe, a broker's lists);
    for a cluster URL, one per node behind a `ClusterStoreRedis`."""
    parsed = parse_redis_url(url)
    if parsed is None:
        options = plain_url_options(url, options)
        return cast(StoreRedis, StoreRedis.from_url(url, driver_info=DRIVER_INFO, **options))
    options = {"driver_info": DRIVER_INFO, **options}
    if isinstance(parsed, ClusterUrl):
        return _cluster_client(parsed, StoreRedis.from_pool, redis.ConnectionPool, options)
    plain = sentinels(parsed).master_for(parsed.master, redis_class=StoreRedis, **options)
    plain.following = follow_primary(plain.connection_pool)
    return cast(StoreRedis, plain)


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

    # As `_Translating.following`; stopped on close without waiting (not on the loop).
    following: Follower | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close the client's connections and stop following its pool's primary."""
        if self.following is not None:
            self.following.stop()
        await super().aclose(close_connection_pool)

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


# The api's async client for any URL (`connect_async`): on one pool, or a cluster's router.
AsyncStoreClient = AsyncStoreRedis | AsyncClusterStoreRedis

# What every async pool is made with. redis-py's async pool hands out a pooled connection
# the server has closed (a Redis restart or failover, its ``timeout``, a proxy) as if it
# were live, so the command on it fails, while its maintenance notifications are on (the
# default with RESP3: redis/redis-py#4128); off, the pool reconnects it first. They serve
# managed Redis's planned maintenance, which the store follows as any failover.
#
# Every async pool is a blocking one with the sync pool's size and wait (`_POOL_OPTIONS`):
# redis-py's default async pool holds 100 connections and fails the 101st command under
# way at once ("Too many connections"), so an api serving a few hundred waits at once
# answered some of them 503 with Redis idle. A task now waits for a free connection.
_ASYNC_POOL_OPTIONS: dict[str, Any] = {
    "driver_info": DRIVER_INFO,
    "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    "max_connections": _POOL_OPTIONS["max_connections"],
    "timeout": _POOL_OPTIONS["timeout"],
}


def connect_async(url: str, **options: Any) -> AsyncStoreClient:
    """An async store client for ``url`` with the connection ``options`` given (for a
    sentinel URL, on redis-py's async sentinel pool; for a cluster URL, one per node
    behind an `AsyncClusterStoreRedis`)."""
    parsed = parse_redis_url(url)
    if parsed is None:
        options = {**_ASYNC_POOL_OPTIONS, **plain_url_options(url, options)}
        pool = aioredis.BlockingConnectionPool.from_url(url, **options)
        return cast(AsyncStoreRedis, AsyncStoreRedis.from_pool(pool))
    options = {**_ASYNC_POOL_OPTIONS, **options}
    if isinstance(parsed, ClusterUrl):
        return _async_cluster_client(parsed, options)
    kwargs = {**sentinel_kwargs(AsyncRetry(NoBackoff(), 0)), **parsed.sentinel_kwargs()}
    asked = AsyncNewestSentinel(
        list(parsed.sentinels), sentinel_kwargs=kwargs, **parsed.connection_kwargs()
    )
    client = asked.master_for(
        parsed.master,
        redis_class=AsyncStoreRedis,
        connection_pool_class=AsyncSentinelBlockingPool,
        **options,
    )
    client.following = follow_primary(client.connection_pool, checker=sentinels(parsed))
    return cast(AsyncStoreRedis, client)


def _async_cluster_client(parsed: ClusterUrl, options: dict[str, Any]) -> AsyncClusterStoreRedis:
    """`_cluster_client` for the api: an `AsyncStoreRedis` per node."""
    cluster_map = ClusterMap(parsed)
    connection_class = AsyncSSLNodeConnection if parsed.tls else AsyncNodeConnection

    def node_client(host: str, port: int) -> aioredis.Redis:
        kwargs = _node_kwargs(parsed, cluster_map, host, port, options)
        pool = aioredis.BlockingConnectionPool(connection_class=connection_class, **kwargs)
        return AsyncStoreRedis.from_pool(pool)

    nodes = NodeClients(cluster_map, node_client)
    router = AsyncClusterStoreRedis(nodes, _encoder(options))
    router.following = follow_cluster(nodes, cut_connections)
    return router
