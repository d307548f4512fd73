"""The store's clients on a Redis Cluster: every command to the primary that owns its
key's slot, on that node's own store client.

redis-py's `RedisCluster` routes by slot too, but refuses scripts inside a pipeline
(``EVALSHA`` is among its blocked pipeline commands), and the store's steps are pipelines
of scripts. So the store routes itself, over the store clients it uses on one Redis, one
per node (`cluster.NodeClients`, each on a pool of `cluster.NodeConnection`): each node's
client translates errors (`StoreUnavailable`), holds connections per thread and loads
the scripts as it connects (the fast path), confirms acknowledged writes with WAIT on
the connection that made them (`Durability`) and checks slots (``slot_check``), as on
one Redis. The routers only choose the node:

- a command goes to the owner of its key's slot (`slots.routing_key`: a script's first
  key); a keyless one (PING, INFO, PUBLISH: cluster pub/sub reaches subscribers on every
  node) to the owner of the first slot; SCRIPT and FLUSHALL/FLUSHDB to every primary.
  One the node did not run (`cluster.NotRun`: no connection, or its slot has moved) is
  sent once more when the map, read again, names another owner (`_moved_to`); so after
  a failover the first command for a moved slot reaches the promoted primary. Pipelines
  are not sent again (some of their commands may have run).
- a pipeline (`RoutedPipeline`) is queued whole, then at ``execute`` split by node: one
  store pipeline per node, in turn (scripts, WAIT and errors as on one Redis), its
  replies put back in the order queued. Every node's pipeline runs; the first error
  raised, if any, is raised after. redis-py's `Script` (and the store's `LuaScripts`)
  queue on it as on any pipeline. One node in all (every key of one slot) is one
  pipeline, as on one Redis.
- a transaction names keys of one slot (else `CrossSlotError`, whatever the slot check
  says) and runs on its owner's client. WATCH is not offered.
- ``scan_iter`` walks every primary in turn.

The api's async client (`AsyncClusterStoreRedis`) is the same router over the async
store client per node. redis-py's ``redis.asyncio.RedisCluster`` would route the api's
few commands too, but not through the store's client (so not its error translation) and
with failover rules of its own (its retries, its topology reads, a connection per node
the follower cannot cut); one model for both clients, with one map and one follower
(`cluster.follow_cluster`), is simpler to reason about and to test. Its subscription
(`RoutedPubSub`) is made on the first primary's client as it first connects.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import redis
import redis.asyncio as aioredis
from redis._parsers import Encoder  # redis.connection uses it without exporting it

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.cluster import NodeClients, NotRun
from switchboard.shared.store.follow import FOLLOWER_JOIN_S, Follower
from switchboard.shared.store.redis_errors import unavailable
from switchboard.shared.store.slots import (
    SCRIPT_COMMANDS,
    check_one_slot,
    command_keys,
    routing_key,
)

# Commands every primary runs (their reply: the first primary's).
EVERY_PRIMARY = frozenset({"SCRIPT", "FLUSHALL", "FLUSHDB"})

Client = TypeVar("Client")
# A queued command: its arguments and redis-py's options.
Queued = tuple[tuple[Any, ...], Mapping[str, Any]]


def to_every_primary(args: tuple[Any, ...]) -> bool:
    """Whether a command goes to every primary: its first word is one of `EVERY_PRIMARY`
    (redis-py names a subcommand in the same argument: ``SCRIPT LOAD``)."""
    words = str(args[0]).split(maxsplit=1)
    return bool(words) and words[0].upper() in EVERY_PRIMARY


class ClusterStoreRedis(redis.Redis):
    """The store's sync client on a Redis Cluster (see the module)."""

    # What follows the cluster's primaries (`cluster.follow_cluster`); stopped on close.
    following: Follower | None = None

    def __init__(self, nodes: NodeClients[redis.Redis], encoder: Encoder) -> None:
        # No `redis.Redis.__init__`: a router has no pool of its own, only its nodes' clients.
        self.nodes = nodes
        self._encoder = encoder

    def __repr__(self) -> str:
        return f"<{type(self).__name__} seeds={list(self.nodes.map.parsed.nodes)}>"

    def get_encoder(self) -> Encoder:
        """How keys and arguments are encoded (a `Script`'s SHA is taken on it)."""
        return self._encoder

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Run one command on the primary that owns its key's slot (see the module)."""
        if to_every_primary(args):
            replies = [c.execute_command(*args, **options) for c in self.primary_clients()]  # type: ignore[no-untyped-call]
            return replies[0]
        key = routing_key(args)
        client = self.client_for(key)
        began = time.monotonic()
        try:
            return client.execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except StoreUnavailable as exc:
            moved = _moved_to(self.nodes, key, client, exc, began)
            if moved is None:
                raise
        return moved.execute_command(*args, **options)  # type: ignore[no-untyped-call]

    def client_for(self, key: Any | None) -> redis.Redis:
        """The store client of the primary that owns ``key``'s slot (the first primary's
        for None); the cluster's map is read first when never read or found stale."""
        try:
            self.nodes.map.ensure_read()
            return self.nodes.for_key(key)
        except redis.ConnectionError as exc:
            raise unavailable(exc) from exc

    def primary_clients(self) -> list[redis.Redis]:
        """The store client of every primary."""
        try:
            self.nodes.map.ensure_read()
            return self.nodes.primaries()
        except redis.ConnectionError as exc:
            raise unavailable(exc) from exc

    def by_node(self, stack: Sequence[Queued]) -> list[tuple[redis.Redis, list[int]]]:
        """The positions of the queued commands in ``stack`` by the node client each goes
        to, in the order each node first appears."""
        try:
            self.nodes.map.ensure_read()
            return _by_node(stack, self.nodes)
        except redis.ConnectionError as exc:
            raise unavailable(exc) from exc

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> RoutedPipeline:
        """A pipeline split by node at ``execute`` (a transaction: on one node)."""
        return RoutedPipeline(self, transaction)

    def scan_iter(
        self, match: Any = None, count: int | None = None, _type: str | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        """The keys matching ``match`` on every primary, one primary after the other."""
        for client in self.primary_clients():
            yield from client.scan_iter(match=match, count=count, _type=_type, **kwargs)

    def pubsub(self, **kwargs: Any) -> redis.client.PubSub:
        """A subscription on the first primary (pub/sub reaches every node's subscribers)."""
        return self.client_for(None).pubsub(**kwargs)

    def close(self) -> None:
        """Stop following the primaries and close every node's client."""
        if self.following is not None:
            self.following.stop(join_s=FOLLOWER_JOIN_S)
        for client in self.nodes.made().values():
            client.close()


class RoutedPipeline(redis.client.Pipeline):
    """A `ClusterStoreRedis` pipeline: queued here, sent at ``execute`` as one store
    pipeline per node (see the module)."""

    def __init__(self, router: ClusterStoreRedis, transaction: bool) -> None:
        super().__init__(None, {}, transaction, None)  # type: ignore[arg-type]
        self.router = router
        self.transactional = transaction

    def immediate_execute_command(self, *args: Any, **options: Any) -> NoReturn:
        """WATCH (the only command sent at once) is not offered on a cluster router."""
        raise TypeError("the cluster router's pipelines take no WATCH")

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands (see the module); their replies in the order queued."""
        stack, scripts = self.command_stack, self.scripts
        try:
            if not stack:
                return []
            if self.transactional or self.explicit_transaction:
                client = self.router.client_for(_transaction_key(stack))
                return _queued_on(client.pipeline(True), stack, scripts).execute(raise_on_error)
            replies: list[Any] = [None] * len(stack)
            failed: list[Exception] = []
            for client, indexes in self.router.by_node(stack):
                pipe = _queued_on(client.pipeline(False), [stack[i] for i in indexes], scripts)
                try:
                    answered = pipe.execute(raise_on_error)
                except Exception as exc:  # raised below, once every node ran
                    failed.append(exc)
                    continue
                for i, reply in zip(indexes, answered, strict=True):
                    replies[i] = reply
            if failed:
                raise failed[0]
            return replies
        finally:
            self.reset()


class AsyncClusterStoreRedis(aioredis.Redis):
    """The api's async store client on a Redis Cluster: `ClusterStoreRedis` over the
    async store client per node (see the module)."""

    # What follows the cluster's primaries; stopped on close without waiting (not on the loop).
    following: Follower | None = None

    def __init__(self, nodes: NodeClients[aioredis.Redis], encoder: Encoder) -> None:
        # No `aioredis.Redis.__init__`: a router has no pool of its own.
        self.nodes = nodes
        self._encoder = encoder

    def __repr__(self) -> str:
        return f"<{type(self).__name__} seeds={list(self.nodes.map.parsed.nodes)}>"

    def get_encoder(self) -> Encoder:
        """How keys and arguments are encoded (an `AsyncScript`'s SHA is taken on it)."""
        return self._encoder

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Run one command on the primary that owns its key's slot (see the module)."""
        if to_every_primary(args):
            clients = await self.primary_clients()
            replies = [await c.execute_command(*args, **options) for c in clients]  # type: ignore[no-untyped-call]
            return replies[0]
        key = routing_key(args)
        client = await self.client_for(key)
        began = time.monotonic()
        try:
            return await client.execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, NotRun):
                raise
            moved = await asyncio.to_thread(_moved_to, self.nodes, key, client, exc, began)
            if moved is None:
                raise
        return await moved.execute_command(*args, **options)  # type: ignore[no-untyped-call]

    async def client_for(self, key: Any | None) -> aioredis.Redis:
        """As `ClusterStoreRedis.client_for` (the map read off the loop)."""
        try:
            if self.nodes.map.needs_reading:
                await asyncio.to_thread(self.nodes.map.ensure_read)
            return self.nodes.for_key(key)
        except redis.ConnectionError as exc:
            raise unavailable(exc) from exc

    async def primary_clients(self) -> list[aioredis.Redis]:
        """The store client of every primary."""
        await self.client_for(None)  # reads the map when it must
        return self.nodes.primaries()

    async def by_node(self, stack: Sequence[Queued]) -> list[tuple[aioredis.Redis, list[int]]]:
        """As `ClusterStoreRedis.by_node`."""
        await self.client_for(None)  # reads the map when it must
        try:
            return _by_node(stack, self.nodes)
        except redis.ConnectionError as exc:
            raise unavailable(exc) from exc

    def pipeline(
        self, transaction: bool = True, shard_hint: str | None = None
    ) -> AsyncRoutedPipeline:
        """As `ClusterStoreRedis.pipeline`."""
        return AsyncRoutedPipeline(self, transaction)

    def pubsub(self, **kwargs: Any) -> RoutedPubSub:
        """A subscription on the first primary, chosen as it first connects."""
        return RoutedPubSub(self, **kwargs)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Stop following the primaries and close every node's client."""
        if self.following is not None:
            self.following.stop()
        for client in self.nodes.made().values():
            await client.aclose()


class AsyncRoutedPipeline(aioredis.client.Pipeline):
    """`RoutedPipeline` for the api's event loop."""

    def __init__(self, router: AsyncClusterStoreRedis, transaction: bool) -> None:
        super().__init__(None, {}, transaction, None)  # type: ignore[arg-type]
        self.router = router
        self.transactional = transaction

    async def immediate_execute_command(self, *args: Any, **options: Any) -> NoReturn:
        """WATCH (the only command sent at once) is not offered on a cluster router."""
        raise TypeError("the cluster router's pipelines take no WATCH")

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        """As `RoutedPipeline.execute`."""
        stack, scripts = self.command_stack, self.scripts
        try:
            if not stack:
                return []
            if self.transactional or self.explicit_transaction:
                client = await self.router.client_for(_transaction_key(stack))
                pipe = _queued_on(client.pipeline(True), stack, scripts)
                return await pipe.execute(raise_on_error)
            replies: list[Any] = [None] * len(stack)
            failed: list[Exception] = []
            for client, indexes in await self.router.by_node(stack):
                pipe = _queued_on(client.pipeline(False), [stack[i] for i in indexes], scripts)
                try:
                    answered = await pipe.execute(raise_on_error)
                except Exception as exc:  # raised below, once every node ran
                    failed.append(exc)
                    continue
                for i, reply in zip(indexes, answered, strict=True):
                    replies[i] = reply
            if failed:
                raise failed[0]
            return replies
        finally:
            await self.reset()  # type: ignore[no-untyped-call]


class RoutedPubSub(aioredis.client.PubSub):
    """A subscription of `AsyncClusterStoreRedis`, on the pool of the first primary's
    client as it first connects (after a failover a new one finds the new map)."""

    def __init__(self, router: AsyncClusterStoreRedis, **kwargs: Any) -> None:
        super().__init__(None, encoder=router.get_encoder(), **kwargs)  # type: ignore[arg-type]
        self.router = router

    async def connect(self) -> None:
        """Connect on the first primary's pool the first time, as a PubSub does."""
        if self.connection is None:
            client = await self.router.client_for(None)
            self.connection_pool = client.connection_pool
        await super().connect()  # type: ignore[no-untyped-call]


def _moved_to(
    nodes: NodeClients[Client], key: Any | None, sent_to: Client, exc: Exception, began: float
) -> Client | None:
    """Where to send once more a command ``sent_to`` failed with ``exc`` (sent at
    ``began``): when the node ran none of it (`NotRun`) and the map, read since, names
    another owner for ``key``'s slot, that owner's client; else None."""
    if not isinstance(exc.__cause__, NotRun):
        return None
    nodes.map.read_since(began)
    try:
        owner = nodes.for_key(key)
    except redis.ConnectionError:
        return None
    return owner if owner is not sent_to else None


def primary_clients(client: redis.Redis) -> list[redis.Redis]:
    """The client of each primary behind ``client``: its nodes' for a cluster router,
    else itself (one Redis, or a sentinel group's primary)."""
    return client.primary_clients() if isinstance(client, ClusterStoreRedis) else [client]


def _transaction_key(stack: Sequence[Queued]) -> Any | None:
    """The key a transaction is routed by; every key it names must be in one slot."""
    keys = [key for args, _ in stack for key in command_keys(args)]
    check_one_slot("transaction", keys)
    return keys[0] if keys else None


def _by_node(stack: Sequence[Queued], nodes: NodeClients[Client]) -> list[tuple[Client, list[int]]]:
    """The queued commands' positions grouped by the node client each goes to, in the
    order each node first appears."""
    groups: dict[int, tuple[Client, list[int]]] = {}
    for i, (args, _) in enumerate(stack):
        client = nodes.for_key(routing_key(args))
        groups.setdefault(id(client), (client, []))[1].append(i)
    return list(groups.values())


Pipe = TypeVar("Pipe", redis.client.Pipeline, aioredis.client.Pipeline)


def _queued_on(pipe: Pipe, commands: Sequence[Queued], scripts: set[Any]) -> Pipe:
    """``pipe`` with ``commands`` queued, and the scripts they run registered on it."""
    shas = {str(args[1]) for args, _ in commands if str(args[0]).upper() in SCRIPT_COMMANDS}
    pipe.scripts = {s for s in scripts if s.sha in shas}
    for args, options in commands:
        pipe.pipeline_execute_command(*args, **options)  # type: ignore[no-untyped-call]
    return pipe
