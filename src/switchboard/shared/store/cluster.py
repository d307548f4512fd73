"""The store on a Redis Cluster (``redis+cluster://``): where each slot's primary is, the
connections to each node, and the thread that follows failovers.

The store's keys may carry different hash tags, so they may be in any slot on any shard.
Its cluster clients (`router`) send each command to the primary that owns its key's
slot, on a store client of that node's own (one pool per node address, made on first
use: `NodeClients`). This module holds what they share:

- `ClusterMap`: which primary owns each of the 16384 slots, as the cluster says. It is
  read by redis-py's cluster machinery (its `NodesManager`: ``CLUSTER SLOTS`` asked of
  the seed nodes the URL lists, then of the nodes it learned) at the first command, so a
  cluster down at start is a failed command like any other, not a failed start; and
  read again once found stale, at most once per `REFRESH_EVERY_S`.
- `NodeConnection`: a redis-py connection to one node. The server answering ``MOVED`` or
  ``ASK`` (the slot moved), ``READONLY`` (the node was demoted) or ``CLUSTERDOWN`` (the
  cluster is electing) means the map is stale: the connection marks it so, closes and
  raises `NotRun` (a ``ConnectionError``: the store client raises `StoreUnavailable`). A
  connect that fails marks the map stale and raises `NotRun` too. Either way the node ran
  nothing of that command, so the router sends a single command once more when the map,
  read again, names another owner for its slot (the first command after a failover
  reaches the promoted primary instead of failing); otherwise callers retry their
  idempotent steps, routed on the map read again.
- `follow_cluster`: twice a second each primary the map knows is asked its ``ROLE`` (one
  command per node; an idle client sends nothing else, and nothing before its first
  command). When one is no longer a primary or does not answer, the map is read again;
  and a node that no longer owns any slot has every connection of its pool cut (its
  sockets shut down, as if the server had closed them), so nothing keeps writing to a
  demoted node. The thread ends when the client closes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import redis
import redis.asyncio as aioredis
from redis.cluster import ClusterNode, NodesManager
from redis.crc import REDIS_CLUSTER_HASH_SLOTS
from redis.exceptions import AskError, ClusterDownError, ReadOnlyError, RedisClusterException

from switchboard.shared.store.follow import Follower
from switchboard.shared.store.slots import key_slot
from switchboard.shared.store.urls import ClusterUrl

log = logging.getLogger("switchboard.store")

# How often each known primary is asked its ROLE (`follow_cluster`).
ROLE_CHECK_S = 0.5
# The least time between two reads of the cluster's map (a stale map is read again then).
REFRESH_EVERY_S = 0.25
# How long the cluster's nodes are given to answer where the slots are, and their ROLE.
DISCOVERY_TIMEOUT_S = 2.0
# Answers that mean the connection's node no longer serves the slot it was sent for.
_MOVED_ON = (AskError, ReadOnlyError, ClusterDownError)  # AskError covers MovedError

# A node's (host, port).
Address = tuple[str, int]
Client = TypeVar("Client")


class NotRun(redis.ConnectionError):
    """The node ran nothing of the command: it could not be connected to, or it answered
    that it does not serve the command's slot (see the module)."""


class ClusterMap:
    """Which primary owns each hash slot, as the cluster says (see the module)."""

    def __init__(self, parsed: ClusterUrl, *, refresh_every_s: float = REFRESH_EVERY_S) -> None:
        self.parsed = parsed
        self.refresh_every_s = refresh_every_s
        self._lock = threading.Lock()
        self._manager: NodesManager | None = None
        self._owners: list[Address | None] | None = None  # by slot; None until first read
        self._primaries: tuple[Address, ...] = ()
        self._stale = False
        self._read_at = float("-inf")  # when the last read ended
        self._failure = ""  # why the last read failed

    @property
    def needs_reading(self) -> bool:
        """Whether the map was never read or was found stale (`ensure_read` reads it)."""
        return self._owners is None or self._stale

    def stale(self) -> None:
        """Note that a node answered as if the map were stale: the next use reads it again."""
        self._stale = True

    def ensure_read(self) -> None:
        """Read the map when never read (``ConnectionError`` when no node answers, or
        when that was the answer within `refresh_every_s`) or stale (unless read within
        `refresh_every_s` or being read by another thread; a failure keeps the map as it
        was, still stale)."""
        if self._owners is None:
            self._read(wait=True)
        elif self._stale:
            with contextlib.suppress(redis.ConnectionError):
                self._read(wait=False)

    def read_since(self, began: float) -> None:
        """Read the map unless it was read (or tried) after ``began`` (a
        ``time.monotonic()``): what a command that failed since ``began`` is routed on
        again. Waits for a read another thread is making; a failure keeps the map."""
        if self._read_at > began:
            return
        with contextlib.suppress(redis.ConnectionError), self._lock:
            if self._read_at <= began:
                self._read_locked()

    def owner(self, key: Any) -> Address:
        """The (host, port) of the primary that owns ``key``'s slot, as last read."""
        owners = self._owners
        address = owners[key_slot(key)] if owners is not None else None
        if address is None:
            raise redis.ConnectionError(f"no primary of the cluster serves the slot of {key!r}")
        return address

    def primaries(self) -> tuple[Address, ...]:
        """Every primary that owns a slot (in slot order), as last read; none before."""
        return self._primaries

    def default(self) -> Address:
        """The primary keyless commands go to: the owner of the first slot."""
        if not self._primaries:
            raise redis.ConnectionError("no primary of the cluster is known")
        return self._primaries[0]

    def role(self, address: Address) -> str:
        """What the node at ``address`` says it is (``master``, ``slave``), asked on the
        discovery client of the node (no retry: a dead node fails at once)."""
        manager = self._manager
        node = manager.get_node(host=address[0], port=address[1]) if manager else None
        if node is None or node.redis_connection is None:
            raise redis.ConnectionError(f"{address[0]}:{address[1]} is not in the cluster's map")
        reply: Any = node.redis_connection.execute_command("ROLE")
        role = reply[0]
        return role.decode() if isinstance(role, bytes) else str(role)

    def close(self) -> None:
        """Close the discovery clients' connections."""
        with self._lock:
            if self._manager is not None:
                self._manager.close()
                self._manager = None

    def _read(self, *, wait: bool) -> None:
        if not self._lock.acquire(blocking=wait):
            return  # another thread reads it now
        try:
            if time.monotonic() - self._read_at < self.refresh_every_s:
                if self._owners is None:  # the first read failed a moment ago
                    raise redis.ConnectionError(self._failure)
                return
            self._read_locked()
        finally:
            self._lock.release()

    def _read_locked(self) -> None:
        try:
            if self._manager is None:
                self._manager = self._connect()
            else:
                self._manager.initialize()
        except (redis.RedisError, RedisClusterException) as exc:
            self._failure = f"no node of the cluster says where the slots are: {exc}"
            raise redis.ConnectionError(self._failure) from exc
        finally:
            self._read_at = time.monotonic()
        self._take(self._manager.slots_cache)

    def _take(self, slots: dict[int, list[ClusterNode]]) -> None:
        owners: list[Address | None] = [None] * REDIS_CLUSTER_HASH_SLOTS
        for slot, nodes in slots.items():
            if nodes:
                owners[slot] = (str(nodes[0].host), int(nodes[0].port))
        self._owners = owners
        self._primaries = tuple(dict.fromkeys(a for a in owners if a is not None))
        self._stale = False

    def _connect(self) -> NodesManager:
        seeds = [ClusterNode(host, port) for host, port in self.parsed.nodes]  # type: ignore[no-untyped-call]
        return NodesManager(
            seeds,
            require_full_coverage=False,
            socket_timeout=DISCOVERY_TIMEOUT_S,
            socket_connect_timeout=DISCOVERY_TIMEOUT_S,
            **self.parsed.client_kwargs(),
        )


class NodeConnection(redis.Connection):
    """A redis-py connection to one node of the cluster (see the module)."""

    def __init__(self, *, cluster_map: ClusterMap, **kwargs: Any) -> None:
        self.cluster_map = cluster_map
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def connect(self) -> None:
        """Connect (and greet) the node; a failure marks the map stale, `NotRun`."""
        try:
            super().connect()  # type: ignore[no-untyped-call]
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.cluster_map.stale()
            raise NotRun(f"{self.host}:{self.port} could not be connected to: {exc}") from exc

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """The server's answer; one that says the map is stale closes the connection and
        raises ``ConnectionError`` (see the module)."""
        try:
            return super().read_response(*args, **kwargs)
        except _MOVED_ON as exc:
            self.cluster_map.stale()
            self.disconnect()  # type: ignore[no-untyped-call]
            raise NotRun(f"{self.host}:{self.port} {_moved(exc)}") from exc


class AsyncNodeConnection(aioredis.Connection):
    """`NodeConnection` for the api's event loop."""

    def __init__(self, *, cluster_map: ClusterMap, **kwargs: Any) -> None:
        self.cluster_map = cluster_map
        super().__init__(**kwargs)

    async def connect(self) -> None:
        """As `NodeConnection.connect`."""
        try:
            await super().connect()  # type: ignore[no-untyped-call]
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self.cluster_map.stale()
            raise NotRun(f"{self.host}:{self.port} could not be connected to: {exc}") from exc

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """As `NodeConnection.read_response`."""
        try:
            return await super().read_response(*args, **kwargs)
        except _MOVED_ON as exc:
            self.cluster_map.stale()
            await self.disconnect()
            raise NotRun(f"{self.host}:{self.port} {_moved(exc)}") from exc


class SSLNodeConnection(NodeConnection, redis.SSLConnection):
    """`NodeConnection` over TLS (``rediss+cluster://``)."""


class AsyncSSLNodeConnection(AsyncNodeConnection, aioredis.SSLConnection):
    """`AsyncNodeConnection` over TLS (``rediss+cluster://``)."""


def _moved(exc: Exception) -> str:
    return f"no longer serves the slot the command was sent for ({type(exc).__name__}: {exc})"


class NodeClients(Generic[Client]):
    """A store client per primary, made on first use by ``make(host, port)`` (one pool per
    node address), found by key through the cluster's map."""

    def __init__(self, cluster_map: ClusterMap, make: Callable[[str, int], Client]) -> None:
        self.map = cluster_map
        self._make = make
        self._lock = threading.Lock()
        self._clients: dict[Address, Client] = {}

    def for_key(self, key: Any | None) -> Client:
        """The client of the primary that owns ``key``'s slot, or of the default primary
        for None (the map as last read: `ClusterMap.ensure_read` first)."""
        return self.at(self.map.default() if key is None else self.map.owner(key))

    def primaries(self) -> list[Client]:
        """A client for every primary the map knows."""
        return [self.at(address) for address in self.map.primaries()]

    def at(self, address: Address) -> Client:
        """The client of the node at ``address`` (made now if it is the first use)."""
        client = self._clients.get(address)
        if client is None:
            with self._lock:
                client = self._clients.get(address)
                if client is None:
                    client = self._clients[address] = self._make(*address)
        return client

    def made(self) -> dict[Address, Client]:
        """Every client made so far, by node address."""
        with self._lock:
            return dict(self._clients)


def follow_cluster(
    nodes: NodeClients[Any], cut: Callable[[Any], None], every_s: float = ROLE_CHECK_S
) -> Follower:
    """Check the primaries of ``nodes``' map every ``every_s`` (a `Follower`, which the
    router owning them stops when closed): read the map again when one is no longer a
    primary or does not answer, and ``cut(pool)`` the connections of every node that no
    longer owns a slot. The map's discovery clients are closed when it ends."""
    check = _PrimariesCheck(cut)
    return Follower(nodes, check, every_s=every_s, name="cluster-primaries", on_end=nodes.map.close)


class _PrimariesCheck:
    """One check of `follow_cluster`: every known primary's ROLE, then the connections
    of each node client whose node owns no slot now are cut (every check, so a node
    demoted before the first check is cut too; a pool with none left is cut of nothing)."""

    def __init__(self, cut: Callable[[Any], None]) -> None:
        self.cut = cut
        self.demoted: frozenset[Address] = frozenset()  # logged already

    def __call__(self, nodes: NodeClients[Any]) -> None:
        cluster_map = nodes.map
        if not all(_is_primary(cluster_map, a) for a in cluster_map.primaries()):
            cluster_map.stale()
            cluster_map.ensure_read()
        owning = frozenset(cluster_map.primaries())
        demoted = frozenset(address for address in nodes.made() if address not in owning)
        for address in demoted - self.demoted:
            log.warning(
                "Redis Cluster node %s:%s no longer owns a slot; cutting its connections",
                *address,
            )
        for address in demoted:
            self.cut(nodes.at(address).connection_pool)
        self.demoted = demoted


def _is_primary(cluster_map: ClusterMap, address: Address) -> bool:
    try:
        return cluster_map.role(address) == "master"
    except redis.RedisError:
        return False
