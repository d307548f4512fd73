"""The store on a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``): redis-py's
`RedisCluster` (sync) and ``redis.asyncio`` `RedisCluster` (the api), with the store's
rules on top.

redis-py keeps the slot map (read from the seed nodes the URL lists), sends each command
to the primary that owns its key's slot, follows MOVED and ASK, and reads the map again
when a node fails or answers that it moved on (a failover, a resharding); a command that
failed that way is sent again on the new map, within its retries. The store's keys may
carry different hash tags, so they may be in any slot on any shard. What is added here:

- every Redis failure is raised once, as `StoreUnavailable` (``NoScriptError`` and
  ``WatchError`` pass through, as on one Redis: `client`);
- a script's keys, and a transaction's, must be in one slot (`CrossSlotError`, before
  anything is sent);
- a pipeline's scripts go out as ``EVALSHA`` (redis-py's cluster pipeline queues it and
  routes it by its first key); every connection to a node loads the store's scripts as
  it connects (redis-py's ``redis_connect_func`` hook), so a promoted replica, which knows
  none, has them before its first command; a script missing all the same (a ``SCRIPT
  FLUSH``) fails its pipeline with `StoreUnavailable` and is loaded on every primary
  (``SCRIPT LOAD`` goes to all of them);
- with `Durability` on, an acknowledged write is followed by WAIT on the node it went to,
  in the same pipeline: redis-py sends a node's commands on one connection, in order;
- the sync client finds the cluster at its first command, not when made, so a cluster
  down when a process starts fails commands (`StoreUnavailable`), not the start (redis-py's
  async client does so by itself);
- the api's async client waits for a free connection (`TURNS` commands under way at once)
  instead of failing: redis-py's async cluster opens at most ``max_connections`` per node
  and raises ``MaxConnectionsError`` past them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio.cluster as aiocluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException
from redis.retry import Retry

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.durability import NO_WAIT, Durability, acknowledged_call
from switchboard.shared.store.lua_scripts import all_sources, load_on
from switchboard.shared.store.redis_errors import PASSED_THROUGH, unavailable
from switchboard.shared.store.slots import (
    check_one_slot,
    check_script,
    command_keys,
)
from switchboard.shared.store.urls import ClusterUrl

# Commands the api's async client has under way at once; more wait for one to end.
TURNS = 512
# How often a command that found its node down (or the cluster electing) is sent again, on
# the map read again: within about a second, then the caller sees `StoreUnavailable`
# (redis-py's default retries for several seconds; the store's steps retry themselves).
RETRIES = 3
RETRY_BACKOFF_CAP_S = 0.5
# Errors of redis-py's cluster clients that become `StoreUnavailable` (RedisClusterException
# is no RedisError: no node answers, a slot no node serves).
_FAILURES = (redis.RedisError, RedisClusterException)


class ClusterStoreRedis(RedisCluster):
    """The store's sync client on a Redis Cluster (see the module)."""

    durability: Durability = NO_WAIT

    def __init__(self, durability: Durability = NO_WAIT, **kwargs: Any) -> None:
        # redis-py's constructor asks the seeds for the slot map: it runs at first use
        # (`start`). Scripts take their SHA on the encoder before that.
        self.durability = durability
        self.started = False
        self._cluster_kwargs = kwargs
        self._starting = threading.Lock()
        self._starter: int | None = None  # the thread running the constructor
        self.encoder = redis.ConnectionPool(**_encoding(kwargs)).get_encoder()

    def __repr__(self) -> str:
        seeds = [f"{n.host}:{n.port}" for n in self._cluster_kwargs.get("startup_nodes", [])]
        return f"<{type(self).__name__} seeds={seeds}>"

    def start(self) -> None:
        """Find the cluster (redis-py's constructor) unless found; `StoreUnavailable`
        when no node answers."""
        if self.started or self._starter == threading.get_ident():
            return  # found, or being found by this thread (the constructor's own commands)
        with self._starting:
            if self.started:
                return
            self._starter = threading.get_ident()
            try:
                super().__init__(**self._cluster_kwargs)
            except _FAILURES as exc:
                raise unavailable(exc) from exc
            finally:
                self._starter = None
            self.started = True

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """Run one command on the node(s) redis-py routes it to (see the module)."""
        self.start()
        check_script(args)
        if self.durability.acknowledged(args):
            return acknowledged_call(self, args, kwargs)
        try:
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]
        except PASSED_THROUGH:
            raise
        except _FAILURES as exc:
            raise unavailable(exc) from exc

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterStorePipeline:
        """A pipeline with the store's rules (a transaction: keys of one slot)."""
        self.start()
        return ClusterStorePipeline(
            self,
            nodes_manager=self.nodes_manager,
            commands_parser=self.commands_parser,
            startup_nodes=self.nodes_manager.startup_nodes,
            result_callbacks=self.result_callbacks,
            cluster_response_callbacks=self.cluster_response_callbacks,
            reinitialize_steps=self.reinitialize_steps,
            retry=self.retry,
            transaction=transaction,
        )

    def pubsub(self, node: Any = None, host: Any = None, port: Any = None, **kwargs: Any) -> Any:
        """redis-py's cluster subscription (the cluster found first)."""
        self.start()
        return super().pubsub(node, host, port, **kwargs)

    def node_client(self, key: Any | None) -> redis.Redis:
        """redis-py's client of the primary that owns ``key``'s slot (the default node's
        for None)."""
        self.start()
        if key is None:
            return self.get_redis_connection(self.get_default_node())  # type: ignore[no-untyped-call]
        return self.get_redis_connection(self.get_node_from_key(key))  # type: ignore[no-untyped-call]

    def load_store_scripts(self) -> None:
        """Load every store script on every primary; a failure is left to the next
        command to meet."""
        with contextlib.suppress(StoreUnavailable):
            for source in all_sources():
                self.script_load(source)

    def close(self) -> None:
        """Close every node's connections (nothing before the cluster was found)."""
        if self.started:
            super().close()


class ClusterStorePipeline(ClusterPipeline):
    """A `ClusterStoreRedis` pipeline: redis-py's, with the store's rules (see the module)."""

    # A shortfall raises `NotReplicated` (set for a single refused write).
    refuse_short = False

    def __init__(self, store: ClusterStoreRedis, *, transaction: Any, **kwargs: Any) -> None:
        super().__init__(transaction=transaction, **kwargs)
        self.store = store
        self.transactional = bool(transaction)
        self._keys: list[Any] = []  # a transaction's
        self._acknowledged: list[Any] = []  # the first key of each acknowledged write

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """Queue a command (a script's keys checked, an acknowledged write noted)."""
        check_script(args)
        if self.transactional:
            self._keys.extend(command_keys(args))
        elif self.store.durability.acknowledged(args):
            self._acknowledged.append(command_keys(args)[0])
        return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands (and WAIT); a Redis error is `StoreUnavailable`."""
        keys, acknowledged = self._keys, self._acknowledged
        self._keys, self._acknowledged = [], []
        try:
            check_one_slot("transaction", keys)
        except BaseException:
            self.reset()  # type: ignore[no-untyped-call]
            raise
        waits = self._queue_waits(acknowledged)
        try:
            replies: list[Any] = super().execute(raise_on_error and not waits)
            if waits:
                for reply in replies[-waits:]:
                    self.store.durability.confirmed(_fewest(reply), refuse=self.refuse_short)
                del replies[-waits:]
                if raise_on_error:  # a command that failed: its error, as redis-py raises it
                    for reply in replies:
                        if isinstance(reply, Exception):
                            raise reply
            if any(isinstance(reply, NoScriptError) for reply in replies):
                self.store.load_store_scripts()
            return replies
        except NoScriptError as exc:
            self.store.load_store_scripts()
            raise unavailable(exc) from exc
        except PASSED_THROUGH:
            raise
        except _FAILURES as exc:
            raise unavailable(exc) from exc
        finally:
            self.refuse_short = False

    def _queue_waits(self, keys: list[Any]) -> int:
        """Queue WAIT on each node the acknowledged writes (``keys``) go to; how many."""
        if not keys:
            return 0
        try:
            found = [self.store.get_node_from_key(k) for k in keys]  # type: ignore[no-untyped-call]
        except _FAILURES as exc:
            self.reset()  # type: ignore[no-untyped-call]
            raise unavailable(exc) from exc
        nodes = {node.name: node for node in found}
        for node in nodes.values():
            wait = self.store.durability.wait_args()
            super().execute_command(*wait, target_nodes=node)  # type: ignore[no-untyped-call]
        return len(nodes)


def _fewest(reply: Any) -> Any:
    """WAIT's reply, or the fewest replicas of several nodes' replies."""
    return min(reply.values()) if isinstance(reply, dict) else reply


def _encoding(options: dict[str, Any]) -> dict[str, Any]:
    names = ("encoding", "encoding_errors", "decode_responses")
    return {name: options[name] for name in names if name in options}


def _cluster_kwargs(parsed: ClusterUrl, options: dict[str, Any]) -> dict[str, Any]:
    """What redis-py's cluster clients are made with: the URL's seeds, credentials and TLS
    options, a map that may lack slots (mid-failover), and ``options``."""
    return {"require_full_coverage": False, **parsed.client_kwargs(), **options}


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(base=0.01, cap=RETRY_BACKOFF_CAP_S)


def cluster_client(
    parsed: ClusterUrl, options: dict[str, Any], *, durability: Durability = NO_WAIT
) -> ClusterStoreRedis:
    """The store's sync client on the cluster ``parsed`` names: each node on a blocking
    pool made with ``options`` when they name a wait (``timeout``)."""
    seeds = [ClusterNode(host, port) for host, port in parsed.nodes]  # type: ignore[no-untyped-call]
    if "timeout" in options:
        options = {**options, "connection_pool_class": redis.BlockingConnectionPool}
    kwargs = {**_cluster_kwargs(parsed, options), "redis_connect_func": load_on}
    retry = Retry(_backoff(), RETRIES)
    return ClusterStoreRedis(durability, startup_nodes=seeds, retry=retry, **kwargs)


class AsyncClusterStoreRedis(aiocluster.RedisCluster):
    """The api's async store client on a Redis Cluster (see the module)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_connections=2 * TURNS, **kwargs)
        self._turns: asyncio.Semaphore | None = None
        self._turns_loop: asyncio.AbstractEventLoop | None = None
        self._holding: set[asyncio.Task[Any]] = set()

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold one of `TURNS` (a task that holds one already takes no other)."""
        task = asyncio.current_task()
        if task is None or task in self._holding:
            yield
            return
        loop = asyncio.get_running_loop()
        if self._turns is None or self._turns_loop is not loop:
            self._turns, self._turns_loop = asyncio.Semaphore(TURNS), loop
        async with self._turns:
            self._holding.add(task)
            try:
                yield
            finally:
                self._holding.discard(task)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """Run one command (see the module); a Redis error is `StoreUnavailable`."""
        check_script(args)
        async with self.turn():
            try:
                return await super().execute_command(*args, **kwargs)
            except PASSED_THROUGH:
                raise
            except _FAILURES as exc:
                raise unavailable(exc) from exc

    def pipeline(
        self, transaction: Any = None, shard_hint: Any = None
    ) -> AsyncClusterStorePipeline:
        """A pipeline whose errors are `StoreUnavailable` (a transaction: keys of one slot)."""
        return AsyncClusterStorePipeline(self, transaction)  # type: ignore[abstract]


class AsyncClusterStorePipeline(aiocluster.ClusterPipeline):
    """`ClusterStorePipeline`'s error and slot rules for the api's event loop."""

    def __init__(self, client: AsyncClusterStoreRedis, transaction: Any = None) -> None:
        super().__init__(client, transaction)
        self.store = client
        self.transactional = bool(transaction)
        self._keys: list[Any] = []

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """Queue a command (a script's keys checked)."""
        check_script(args)
        if self.transactional:
            self._keys.extend(command_keys(args))
        return super().execute_command(*args, **kwargs)

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        """Send the queued commands; a Redis error is raised as `StoreUnavailable`."""
        keys, self._keys = self._keys, []
        try:
            check_one_slot("transaction", keys)
        except BaseException:
            await self.reset()  # type: ignore[no-untyped-call]
            raise
        async with self.store.turn():
            try:
                return await super().execute(raise_on_error, allow_redirections)
            except PASSED_THROUGH:
                raise
            except _FAILURES as exc:
                raise unavailable(exc) from exc


def async_cluster_client(parsed: ClusterUrl, options: dict[str, Any]) -> AsyncClusterStoreRedis:
    """The api's async client on the cluster ``parsed`` names, made with ``options``."""
    seeds = [aiocluster.ClusterNode(host, port) for host, port in parsed.nodes]
    options = {k: v for k, v in options.items() if k not in ("timeout", "max_connections")}
    retry = AsyncRetry(_backoff(), RETRIES)
    kwargs = _cluster_kwargs(parsed, options)
    return AsyncClusterStoreRedis(startup_nodes=seeds, retry=retry, **kwargs)


def info_of_primaries(client: redis.Redis, section: str) -> list[dict[str, Any]]:
    """``INFO section`` of every primary behind ``client`` (one Redis: its own)."""
    if not isinstance(client, ClusterStoreRedis):
        return [client.info(section)]
    client.start()
    try:
        return [client.get_redis_connection(n).info(section) for n in client.get_primaries()]
    except _FAILURES as exc:
        raise unavailable(exc) from exc
