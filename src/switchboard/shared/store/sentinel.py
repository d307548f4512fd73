"""A Sentinel group's primary, found and followed (``redis+sentinel://``).

A ``redis+sentinel://`` URL gives the store's client classes on redis-py's sentinel pool:
each new connection asks the sentinels where the primary is. A connection to a primary
that died fails its command (the caller sees `StoreUnavailable`, the api a 503) and
reconnects to the promoted replica; one to a primary that was demoted answers its next
write READONLY, and redis-py's `SentinelManagedConnection` closes it and reconnects.

A primary demoted on purpose (``SENTINEL FAILOVER``) keeps serving the connections it has
until Sentinel reconfigures it, up to ten seconds later, and what they write there is
thrown away when it resyncs from the new primary. So the store's sentinel pools ask again
(`follow_primary`): at most every `PRIMARY_CHECK_S`, the caller taking a connection (a
thread of the process, or the api's event loop, which owns its pool) asks the sentinels
through the pool's own ``get_master_address()``; when they name another primary, the
pool's own ``disconnect()`` closes every connection it made, idle or in use, so each one
reconnects to the new primary at its next command (a command under way on one fails
once, as on a crash). Sentinels that disagree (right after a failover only one knows) are
settled by their configuration epoch (`NewestSentinel`, `AsyncNewestSentinel`), for the
check and for every new connection alike.

What remains: a pool nobody takes a connection from checks nothing, so a connection held
all along (a subscription) moves at the pool's next use after the switch, or when
Sentinel reconfigures the old primary and closes its clients.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio import sentinel as aiosentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from switchboard.shared.store.driver import DRIVER_INFO
from switchboard.shared.store.urls import SentinelUrl

log = logging.getLogger("switchboard.store")

# How the sentinels themselves are asked where the primary is: quickly, and a sentinel
# that does not answer is skipped for the next one instead of retried.
SENTINEL_TIMEOUT_S = 2.0
# How often a sentinel pool asks where its primary is (`follow_primary`).
PRIMARY_CHECK_S = 0.5
# How long a sentinel that did not answer is skipped while another one answers.
SENTINEL_SKIP_S = 10.0

Address = tuple[str, int]


class PrimaryWatch:
    """When a pool last asked where its primary is, and the primary it was told of."""

    def __init__(self, every_s: float = PRIMARY_CHECK_S) -> None:
        self.every_s = every_s
        self.followed: Address | None = None
        self._next = 0.0
        self._lock = threading.Lock()

    def take_turn(self) -> bool:
        """Whether the caller asks now: a check is due and no other caller took it."""
        now = time.monotonic()
        if now < self._next or not self._lock.acquire(blocking=False):
            return False
        try:
            if now < self._next:
                return False
            self._next = now + self.every_s
            return True
        finally:
            self._lock.release()

    def moved(self, known: Address | None, named: Any) -> bool:
        """Note ``named`` as the primary; whether it differs from the one followed so far
        (or, before the first check, ``known``: the pool's)."""
        before = self.followed or (tuple(known) if known else None)
        self.followed = (str(named[0]), int(named[1]))
        return before is not None and before != self.followed


def _log_moved(pool: Any, before: Address | None, named: Address) -> None:
    log.warning(
        "Redis primary of %r moved from %s to %s:%s; reconnecting",
        pool.service_name,
        f"{before[0]}:{before[1]}" if before else "?",
        *named,
    )


def follow_primary(pool: Any, watch: PrimaryWatch) -> None:
    """Ask the sentinels for ``pool``'s primary (a sync sentinel pool, kombu's too); when
    it moved, disconnect every connection of the pool."""
    known, before = pool.master_address, watch.followed
    try:
        named = pool.get_master_address()
    except redis.RedisError:
        return  # none names one (a failover under way): connections find out
    if watch.moved(known, named):
        _log_moved(pool, before or known, watch.followed or named)
        pool.disconnect()


async def follow_primary_async(pool: Any, watch: PrimaryWatch) -> None:
    """`follow_primary` for an async sentinel pool, on the event loop that owns it."""
    known, before = pool.master_address, watch.followed
    try:
        named = await pool.get_master_address()
    except redis.RedisError:
        return
    if watch.moved(known, named):
        _log_moved(pool, before or known, watch.followed or named)
        await pool.disconnect()


class SentinelBlockingPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """redis-py's sentinel pool (each new connection asks the sentinels for the primary)
    with the blocking pool's wait for a free connection, following its primary
    (`follow_primary`) as connections are taken."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.watch = PrimaryWatch()

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A connection to the primary, the sentinels asked first when a check is due."""
        if self.watch.take_turn():
            follow_primary(self, self.watch)
        return super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]


class AsyncSentinelBlockingPool(
    aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool
):
    """`SentinelBlockingPool` for the api's async clients: a task waits for a free
    connection instead of failing (redis-py's async pool raises "Too many connections"),
    and the primary is checked on the event loop that owns the pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.watch = PrimaryWatch()

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """As `SentinelBlockingPool.get_connection`."""
        if self.watch.take_turn():
            await follow_primary_async(self, self.watch)
        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]


class NewestSentinel(Sentinel):
    """Sentinels asked for the primary the newest configuration names.

    redis-py believes the first sentinel that names a primary. Right after a failover only
    the sentinel that ran it knows the new one; the others learn it within seconds and
    until then still name the old primary, which, demoted on purpose, still answers. Here
    every sentinel is asked and the answer with the highest ``config-epoch`` (Sentinel's
    own order of configurations) wins. A sentinel that did not answer is skipped for
    `SENTINEL_SKIP_S` while another answers, so one that is down does not slow every
    new connection by its timeout."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.down_until: dict[int, float] = {}

    def discover_master(self, service_name: str) -> tuple[str, int]:
        """The (host, port) of the primary of ``service_name`` in the newest configuration."""
        now = time.monotonic()
        answers: list[Any] = []
        errors: list[str] = []
        for sentinel in _in_asking_order(self.sentinels, self.down_until, now):
            if answers and self.down_until.get(id(sentinel), 0.0) > now:
                continue
            try:
                masters: Any = sentinel.sentinel_masters()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.down_until[id(sentinel)] = now + SENTINEL_SKIP_S
                errors.append(f"{sentinel} - {exc!r}")
                continue
            self.down_until.pop(id(sentinel), None)
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.down_until: dict[int, float] = {}
        self.asking: dict[tuple[int, str], asyncio.Task[tuple[str, int]]] = {}

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        """The (host, port) of the primary of ``service_name`` in the newest configuration
        (the lookup under way on this loop, if one is)."""
        loop = asyncio.get_running_loop()
        key = (id(loop), service_name)
        lookup = self.asking.get(key)
        if lookup is None or lookup.done() or lookup.get_loop() is not loop:
            lookup = asyncio.ensure_future(self.ask_every_sentinel(service_name))
            self.asking[key] = lookup
            lookup.add_done_callback(lambda done: _forget(self.asking, key, done))
        # Shielded: a caller cancelled (its request timed out) leaves it to the others.
        return await asyncio.shield(lookup)

    async def ask_every_sentinel(self, service_name: str) -> tuple[str, int]:
        """The (host, port) of the primary of ``service_name`` in the newest configuration."""
        now = time.monotonic()
        answers: list[Any] = []
        errors: list[str] = []
        for sentinel in _in_asking_order(self.sentinels, self.down_until, now):
            if answers and self.down_until.get(id(sentinel), 0.0) > now:
                continue
            try:
                masters: Any = await sentinel.sentinel_masters()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.down_until[id(sentinel)] = now + SENTINEL_SKIP_S
                errors.append(f"{sentinel} - {exc!r}")
                continue
            self.down_until.pop(id(sentinel), None)
            answers.append(masters.get(service_name))
        return _newest(self, service_name, answers, errors)


def _in_asking_order(sentinels: list[Any], down_until: dict[int, float], now: float) -> list[Any]:
    """The sentinels, those taken for down last."""
    return sorted(sentinels, key=lambda s: down_until.get(id(s), 0.0) > now)


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


def async_sentinels(parsed: SentinelUrl, retry: Any) -> AsyncNewestSentinel:
    """`sentinels` for the api's async clients (``retry``: redis-py's async one)."""
    kwargs = {**sentinel_kwargs(retry), **parsed.sentinel_kwargs()}
    return AsyncNewestSentinel(
        list(parsed.sentinels), sentinel_kwargs=kwargs, **parsed.connection_kwargs()
    )
