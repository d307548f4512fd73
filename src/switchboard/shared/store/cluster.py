"""The store on a Redis Cluster (``redis+cluster://``): one hash slot, reached on its owner.

redis-py's `RedisCluster` routes each command by its key's slot, but it refuses scripts in
a pipeline (``EVALSHA`` is in its ``PIPELINE_BLOCKED_COMMANDS``), and the store's steps are
pipelines of scripts that read and write many keys at once. So on a cluster:

- every store key carries one hash tag, the key prefix (``sb:`` becomes ``{sb}:``:
  `Settings`), so every key, and with them every script's keys, is in one slot;
- the store's connections are redis-py's plain ones, each made to the primary that owns
  that slot (`SlotOwnerConnection`), which redis-py's cluster client finds
  (`SlotOwner`: ``CLUSTER SLOTS`` asked of the nodes the URL lists, then of the nodes it
  learned). Every command, pipeline, transaction and script of the store then runs as on
  one Redis, and so does every fast path (held connections, scripts loaded on connect,
  ``WAIT`` for replicas).

What a cluster buys this way is its failover (a replica takes over the slot's primary
without Sentinel) and the deployment shape managed Redis services offer; the store's
load is on one primary at a time. docs/scaling.md says so, with the numbers.

Following a failover: a connection that cannot reach the owner it knew, or that the
server answers ``MOVED``/``ASK`` (the slot moved), ``READONLY`` (the node was demoted)
or ``CLUSTERDOWN`` (the cluster is electing), is closed and its command fails with a
``ConnectionError`` (redis-py retries single commands on a new connection; a pipeline's
caller sees `StoreUnavailable`); its next connection asks the cluster again. And every
pool is followed (`follow_slot_owner`): twice a second the owner it knows is asked its
``ROLE`` (one command to one node); when it is no longer a primary, or does not answer,
the cluster is asked who owns the slot, and when the answer changed every connection of
the pool is cut, so none keeps writing to a node that no longer owns it. (A slot moved
between primaries that both stay up is found by the connections themselves: ``MOVED``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.exceptions import AskError, ClusterDownError, ReadOnlyError, RedisClusterException
from redis.retry import Retry

from switchboard.shared.store.follow import Follower
from switchboard.shared.store.urls import ClusterUrl

log = logging.getLogger("switchboard.store")

# How often a pool's slot owner is checked (`follow_slot_owner`).
OWNER_CHECK_S = 0.5
# How long the cluster's nodes are given to answer where the slot is.
DISCOVERY_TIMEOUT_S = 2.0
# Answers that mean the connection no longer reaches the slot's primary.
_MOVED_ON = (AskError, ReadOnlyError, ClusterDownError)  # AskError covers MovedError


class SlotOwner:
    """Where the primary that owns ``tag_key``'s hash slot is, as the cluster says.

    The address is kept once found and asked again (`refresh`) when a connection to it
    failed or the follower checks; the cluster is read by redis-py's cluster client
    (its nodes manager), made at the first question so a cluster down at start is a
    failed connection like any other, not a failed start."""

    def __init__(self, parsed: ClusterUrl, tag_key: str) -> None:
        self.parsed = parsed
        self.tag_key = tag_key
        self._lock = threading.Lock()
        self._address: tuple[str, int] | None = None
        self._cluster: redis.RedisCluster | None = None
        # A client per owner address, for the follower's ROLE check.
        self._probes: dict[tuple[str, int], redis.Redis] = {}

    def address(self) -> tuple[str, int]:
        """The owner's (host, port): the one known, else asked of the cluster."""
        known = self._address
        return known if known is not None else self.refresh()

    def forget(self, address: tuple[str, int]) -> None:
        """A connection to ``address`` failed: ask the cluster at the next connection."""
        with self._lock:
            if self._address == address:
                self._address = None

    def refresh(self) -> tuple[str, int]:
        """Ask the cluster who owns the slot now (raises ``ConnectionError`` when no node
        answers)."""
        with self._lock:
            try:
                if self._cluster is None:
                    self._cluster = self._connect()
                else:
                    self._cluster.nodes_manager.initialize()
                node = self._cluster.get_node_from_key(self.tag_key)  # type: ignore[no-untyped-call]
            except (redis.RedisError, RedisClusterException) as exc:
                raise redis.ConnectionError(
                    f"no node of the cluster says where {self.tag_key!r} is: {exc}"
                ) from exc
            if node is None:
                raise redis.ConnectionError(f"no node of the cluster owns {self.tag_key!r}")
            self._address = (str(node.host), int(node.port))
            return self._address

    def check(self) -> tuple[str, int]:
        """The owner's address, checked: the one known while it still says it is a
        primary (``ROLE``), else asked of the cluster (`refresh`)."""
        known = self._address
        if known is not None:
            with contextlib.suppress(redis.RedisError):
                if self._role(known) == "master":
                    return known
        return self.refresh()

    def close(self) -> None:
        """Close the cluster client's connections."""
        with self._lock:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None
            for probe in self._probes.values():
                probe.close()
            self._probes.clear()

    def _role(self, address: tuple[str, int]) -> str:
        """What the node at ``address`` says it is (``master``, ``slave``)."""
        with self._lock:
            probe = self._probes.get(address)
            if probe is None:
                probe = self._probes[address] = redis.Redis(
                    host=address[0],
                    port=address[1],
                    socket_timeout=DISCOVERY_TIMEOUT_S,
                    socket_connect_timeout=DISCOVERY_TIMEOUT_S,
                    retry=Retry(NoBackoff(), 0),  # a dead owner fails the check at once
                    **self.parsed.client_kwargs(),
                )
        reply: Any = probe.role()
        role = reply[0]
        return role.decode() if isinstance(role, bytes) else str(role)

    def _connect(self) -> redis.RedisCluster:
        seeds = [ClusterNode(host, port) for host, port in self.parsed.nodes]  # type: ignore[no-untyped-call]
        return redis.RedisCluster(
            startup_nodes=seeds,
            socket_timeout=DISCOVERY_TIMEOUT_S,
            socket_connect_timeout=DISCOVERY_TIMEOUT_S,
            **self.parsed.client_kwargs(),
        )


class SlotOwnerConnection(redis.Connection):
    """A redis-py connection to the slot owner's current address (see the module)."""

    def __init__(self, *, slot_owner: SlotOwner, **kwargs: Any) -> None:
        self.slot_owner = slot_owner
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]

    def _connect(self) -> Any:
        self.host, self.port = self.slot_owner.address()
        try:
            return super()._connect()  # type: ignore[no-untyped-call]
        except OSError:
            self.slot_owner.forget((self.host, self.port))
            raise

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """The server's answer; one that says the slot is elsewhere closes the connection
        and raises ``ConnectionError`` (see the module)."""
        try:
            return super().read_response(*args, **kwargs)
        except _MOVED_ON as exc:
            self.slot_owner.forget((self.host, self.port))
            self.disconnect()  # type: ignore[no-untyped-call]
            raise redis.ConnectionError(
                f"the store's slot is not on {self.host}:{self.port}: {exc}"
            ) from exc


class AsyncSlotOwnerConnection(aioredis.Connection):
    """`SlotOwnerConnection` for the api's event loop."""

    def __init__(self, *, slot_owner: SlotOwner, **kwargs: Any) -> None:
        self.slot_owner = slot_owner
        super().__init__(**kwargs)

    async def _connect(self) -> None:
        # Asking the cluster is a blocking round trip: off the loop (rare: after a failure).
        self.host, self.port = await asyncio.to_thread(self.slot_owner.address)
        try:
            await super()._connect()  # type: ignore[no-untyped-call]
        except OSError:
            self.slot_owner.forget((self.host, self.port))
            raise

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """As `SlotOwnerConnection.read_response`."""
        try:
            return await super().read_response(*args, **kwargs)
        except _MOVED_ON as exc:
            self.slot_owner.forget((self.host, self.port))
            await self.disconnect()
            raise redis.ConnectionError(
                f"the store's slot is not on {self.host}:{self.port}: {exc}"
            ) from exc


class SSLSlotOwnerConnection(SlotOwnerConnection, redis.SSLConnection):
    """`SlotOwnerConnection` over TLS (``rediss+cluster://``)."""


class AsyncSSLSlotOwnerConnection(AsyncSlotOwnerConnection, aioredis.SSLConnection):
    """`AsyncSlotOwnerConnection` over TLS (``rediss+cluster://``)."""


def follow_slot_owner(
    pool: Any, owner: SlotOwner, cut: Callable[[Any], None], every_s: float = OWNER_CHECK_S
) -> Follower:
    """Cut every connection of ``pool`` (``cut(pool)``) once the cluster names another
    owner of the slot (checked every ``every_s`` by a `Follower`, which the store client
    owning the pool stops when closed); ``owner`` is closed when it ends."""
    return Follower(
        pool,
        _OwnerCheck(owner, cut),
        every_s=every_s,
        name="cluster-slot-owner",
        on_end=owner.close,
    )


class _OwnerCheck:
    """One check of `follow_slot_owner`: the owner the cluster names, against the last."""

    def __init__(self, owner: SlotOwner, cut: Callable[[Any], None]) -> None:
        self.owner = owner
        self.cut = cut
        self.known: tuple[str, int] | None = None

    def __call__(self, pool: Any) -> None:
        try:
            named = self.owner.check()
        except redis.RedisError:
            named = None  # an election under way: connections find out themselves
        if self.known is not None and named is not None and named != self.known:
            log.warning(
                "Redis Cluster slot of %r moved from %s:%s to %s:%s; reconnecting",
                self.owner.tag_key,
                *self.known,
                *named,
            )
            self.cut(pool)
        self.known = named or self.known
