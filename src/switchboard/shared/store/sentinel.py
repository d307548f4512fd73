"""A Sentinel group's primary, found and followed (``redis+sentinel://``).

A ``redis+sentinel://`` URL gives the store's client classes on a pool whose connections
ask the sentinels where the primary is each time they connect (redis-py's
`SentinelConnectionPool`): a connection to a primary that died fails its command (the
caller sees `StoreUnavailable`, the api a 503) and reconnects to the promoted replica; one
to a primary that was demoted is closed by its first write (READONLY) and reconnects too.
The fast path (`ThreadHeldRedis`) runs on such a pool as it is: its held connections are
the pool's sentinel-managed ones, reconnected the same way.

A primary demoted on purpose (``SENTINEL FAILOVER``) keeps serving the connections it has
until Sentinel reconfigures it, up to ten seconds later, and what they write there is
thrown away when it resyncs from the new primary. So every sentinel pool is followed
(`follow_primary`): twice a second its sentinels are asked for the primary, and when they
name another one every connection of the pool is cut (as if the server had closed it),
so each reconnects to the new primary at its next command. Sentinels that disagree (right
after a failover only one knows) are settled by their configuration epoch
(`NewestSentinel`, `AsyncNewestSentinel`), for the check and for every new connection
alike. The api's async pools are followed too (their connections, subscriptions
included, cut from the checking thread).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio import sentinel as aiosentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from switchboard.shared.store.driver import DRIVER_INFO
from switchboard.shared.store.follow import Follower, cut_connections
from switchboard.shared.store.urls import SentinelUrl

log = logging.getLogger("switchboard.store")

# How the sentinels themselves are asked where the primary is: quickly, and a sentinel
# that does not answer is skipped for the next one instead of retried.
SENTINEL_TIMEOUT_S = 2.0
# How often a sentinel pool's primary is checked (`follow_primary`).
PRIMARY_CHECK_S = 0.5
# How long a sentinel that did not answer is skipped while another one answers.
SENTINEL_SKIP_S = 10.0


class SentinelBlockingPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """redis-py's sentinel pool (each new connection asks the sentinels for the primary)
    with the blocking pool's wait for a free connection."""


class AsyncSentinelBlockingPool(
    aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool
):
    """`SentinelBlockingPool` for the api's async clients: a task waits for a free
    connection instead of failing (redis-py's async pool raises "Too many connections")."""


class NewestSentinel(Sentinel):
    """Sentinels asked for the primary the newest configuration names.

    redis-py believes the first sentinel that names a primary. Right after a failover only
    the sentinel that ran it knows the new one; the others learn it within seconds and
    until then still name the old primary, which, demoted on purpose, still answers. Here
    every sentinel is asked and the answer with the highest ``config-epoch`` (Sentinel's
    own order of configurations) wins. A sentinel that did not answer is skipped for
    `SENTINEL_SKIP_S` while another answers, so one that is down does not slow every
    new connection by its timeout."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        """The (host, port) of the primary of ``service_name`` in the newest configuration."""
        down: dict[int, float] = self.__dict__.setdefault("_down_until", {})
        now = time.monotonic()
        answers: list[Any] = []
        errors: list[str] = []
        for sentinel in sorted(self.sentinels, key=lambda s: down.get(id(s), 0.0) > now):
            if answers and down.get(id(sentinel), 0.0) > now:
                continue
            try:
                masters: Any = sentinel.sentinel_masters()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                down[id(sentinel)] = now + SENTINEL_SKIP_S
                errors.append(f"{sentinel} - {exc!r}")
                continue
            down.pop(id(sentinel), None)
            answers.append(masters.get(service_name))
        return _newest(self, service_name, answers, errors)


class AsyncNewestSentinel(aiosentinel.Sentinel):
    """`NewestSentinel`'s rule for the api's async clients, asked once for every
    connection that connects meanwhile.

    Each new connection of a sentinel pool asks where the primary is. After a failover
    every connection of the api reconnects at once: hundreds of lookups of every sentinel
    at the same moment, past what a sentinel's own client holds (its pool fails the 101st
    with "Too many connections", which also took that sentinel for down). One lookup is
    made at a time per loop and master; connections that ask while it is under way take
    its answer."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        """The (host, port) of the primary of ``service_name`` in the newest configuration
        (the lookup under way on this loop, if one is)."""
        asking: dict[tuple[int, str], asyncio.Task[tuple[str, int]]]
        asking = self.__dict__.setdefault("_asking", {})
        loop = asyncio.get_running_loop()
        key = (id(loop), service_name)
        lookup = asking.get(key)
        if lookup is None or lookup.done() or lookup.get_loop() is not loop:
            lookup = asyncio.ensure_future(self._ask_every_sentinel(service_name))
            asking[key] = lookup
            lookup.add_done_callback(lambda done: _forget(asking, key, done))
        # Shielded: a caller cancelled (its request timed out) leaves it to the others.
        return await asyncio.shield(lookup)

    async def _ask_every_sentinel(self, service_name: str) -> tuple[str, int]:
        """The (host, port) of the primary of ``service_name`` in the newest configuration."""
        down: dict[int, float] = self.__dict__.setdefault("_down_until", {})
        now = time.monotonic()
        answers: list[Any] = []
        errors: list[str] = []
        for sentinel in sorted(self.sentinels, key=lambda s: down.get(id(s), 0.0) > now):
            if answers and down.get(id(sentinel), 0.0) > now:
                continue
            try:
                masters: Any = await sentinel.sentinel_masters()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                down[id(sentinel)] = now + SENTINEL_SKIP_S
                errors.append(f"{sentinel} - {exc!r}")
                continue
            down.pop(id(sentinel), None)
            answers.append(masters.get(service_name))
        return _newest(self, service_name, answers, errors)


def _forget(asking: dict[Any, Any], key: Any, done: asyncio.Future[Any]) -> None:
    """Drop a finished lookup (``done``) unless a newer one took its place."""
    if asking.get(key) is done:
        del asking[key]
    if not done.cancelled():
        done.exception()  # retrieved: a lookup nobody awaited any more logs no warning


def _newest(
    manager: Any, service_name: str, states: list[Any], errors: list[str]
) -> tuple[str, int]:
    """The primary the answer with the highest ``config-epoch`` names."""
    newest: tuple[int, str, int] | None = None
    for state in states:
        if state and manager.check_master_state(state, service_name):
            epoch = int(state.get("config-epoch", 0))
            if newest is None or epoch > newest[0]:
                newest = (epoch, str(state["ip"]), int(state["port"]))
    if newest is None:
        shown = f" : {', '.join(errors)}" if errors else ""
        raise MasterNotFoundError(f"No master found for {service_name!r}{shown}")
    return newest[1], newest[2]


def follow_primary(
    pool: Any, every_s: float = PRIMARY_CHECK_S, checker: Sentinel | None = None
) -> Follower:
    """Cut every connection of the sentinel ``pool`` once the sentinels' newest
    configuration names another primary (checked every ``every_s`` by a `Follower`, which
    the store client owning the pool stops when closed). A pool made elsewhere (kombu's)
    is given `NewestSentinel`'s rule too, so its connections reconnect where the check
    found the primary; its follower ends with the pool.

    A connection is cut by shutting its socket down, not closed: whoever uses it (a
    thread's held connection, kombu's event loop, the api's event loop) sees the server
    close it, as on a crash, and reconnects through the sentinels to the new primary.
    An async pool (``redis.asyncio``) is checked with ``checker``, sync sentinels of its
    own, from the thread."""
    if type(pool.sentinel_manager) is Sentinel:
        pool.sentinel_manager.__class__ = NewestSentinel
    return Follower(
        pool,
        functools.partial(_check_primary, checker or pool.sentinel_manager),
        every_s=every_s,
        name=f"sentinel-primary-{pool.service_name}",
    )


def _check_primary(checker: Any, pool: Any) -> None:
    known = pool.master_address  # None until a first connection asked for it
    try:
        named = checker.discover_master(pool.service_name)
    except redis.RedisError:
        named = None  # none names one (a failover under way): connections find out
    if known is not None and named is not None and tuple(named) != tuple(known):
        log.warning(
            "Redis primary of %r moved from %s:%s to %s:%s; reconnecting",
            pool.service_name,
            *known,
            *named,
        )
        if hasattr(pool, "proxy"):  # the sync pool keeps it on its proxy
            pool.proxy.master_address = named
        else:
            pool.master_address = named
        cut_connections(pool)


def sentinel_kwargs(retry: Any) -> dict[str, Any]:
    """How the sentinels themselves are asked (quickly; ``retry``: redis-py's, sync or
    async)."""
    return {
        "socket_timeout": SENTINEL_TIMEOUT_S,
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        "retry": retry,
        "driver_info": DRIVER_INFO,
    }


def sentinels(parsed: SentinelUrl) -> NewestSentinel:
    """The URL's sentinels, asked by the sync clients' pools (over TLS for a
    ``rediss+sentinel://`` URL, as are the connections to the primary)."""
    kwargs = {**sentinel_kwargs(Retry(NoBackoff(), 0)), **parsed.sentinel_kwargs()}
    return NewestSentinel(
        list(parsed.sentinels), sentinel_kwargs=kwargs, **parsed.connection_kwargs()
    )
