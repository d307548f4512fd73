"""The store's Redis clients, made from a URL: the one place a Redis error becomes ours.

Every command and pipeline the store sends goes through `StoreRedis` (sync) or
`AsyncStoreRedis` (the api's event loop). A redis-py error raised there (the server is
down, loading, timed out, refused the command) is raised again as `StoreUnavailable`,
``from`` the original, so nothing above the store catches a redis-py exception. Two are
let through as they are, because redis-py's own helpers act on them: ``NoScriptError``
(a script not yet loaded: `Script` loads it and runs it again) and ``WatchError`` (an
optimistic transaction that lost its race).

redis-py reads its own version from the installed package's metadata for each connection
it opens unless given it: a scan of the import path that costs milliseconds, so a burst
that filled a pool (forty api threads at once, a worker's sixty-four) paid seconds of CPU
for it. The version is read once here (`DRIVER_INFO`) and handed to every client.

Every client is made from a URL in this module (`connect`, `connect_plain`,
`connect_async`, `blocking_pool`), in any form `store.urls` reads. A
``redis+sentinel://`` URL gives the same client classes on a pool whose connections ask
the sentinels where the primary is each time they connect (redis-py's
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

Acknowledged writes (`Durability`, off unless ``SWITCHBOARD_REDIS_WAIT_REPLICAS`` is set):
Redis replicates asynchronously, so a write the primary answered can die with it in a
failover. With ``replicas`` set, each acknowledged write (a script named in
`ACKNOWLEDGED_SCRIPTS`: a run's accept, its end, a transcript append) is followed on the
same connection by ``WAIT replicas timeout_ms`` before its answer goes back: a single call
goes out as a non-transactional pipeline of EVALSHA + WAIT (one round trip); a pipeline
that queued one gets WAIT at its end (after EXEC for a transaction). WAIT counts the
connection's own writes, so it must be that connection. When fewer replicas have it within
the timeout the write stands on the primary (it cannot be taken back), and then:

- a run's accept made on its own (`REFUSED_WHEN_SHORT`) raises `NotReplicated`, a
  `StoreUnavailable`: the api answers 503 with Retry-After and the client was told nothing.
  A retry with the same idempotency key answers the same run; without one it may start a
  second run (the first stands unless a failover takes it). This is what closes a planned
  failover's window, where the old primary takes writes its replicas never see.
- anything else (a run's end, an append, a spawn's pipeline) logs a WARNING (at most one
  per `SHORT_LOG_EVERY_S`, with the count since) and goes on: a worker has no client to
  refuse, and a run whose end a failover loses is run again once its lease lapses.

docs/operations.md ("Replication and acknowledged writes") says more.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import socket
import threading
import time
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio import sentinel as aiosentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.driver_info import DriverInfo
from redis.exceptions import NoScriptError, ResponseError, WatchError
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.cluster import (
    AsyncSlotOwnerConnection,
    AsyncSSLSlotOwnerConnection,
    SlotOwner,
    SlotOwnerConnection,
    SSLSlotOwnerConnection,
    follow_slot_owner,
)
from switchboard.shared.store.follow import Follower
from switchboard.shared.store.lua_scripts import load as load_lua
from switchboard.shared.store.lua_scripts import script_names
from switchboard.shared.store.thread_held import ThreadHeldRedis
from switchboard.shared.store.urls import (
    ClusterUrl,
    SentinelUrl,
    parse_redis_url,
    plain_url_options,
)

log = logging.getLogger("switchboard.store")

DRIVER_INFO = DriverInfo(lib_version=redis.__version__)

# Errors redis-py's helpers handle themselves; every other RedisError becomes ours.
_PASSED_THROUGH = (NoScriptError, WatchError)

# How the sentinels themselves are asked where the primary is: quickly, and a sentinel
# that does not answer is skipped for the next one instead of retried.
SENTINEL_TIMEOUT_S = 2.0
# How often a sentinel pool's primary is checked (`follow_primary`).
PRIMARY_CHECK_S = 0.5
# How long closing a sync store client waits for its follower thread to end (a check under
# way can take a connect timeout).
FOLLOWER_JOIN_S = 2.5
# How long a sentinel that did not answer is skipped while another one answers.
SENTINEL_SKIP_S = 10.0


def unavailable(exc: redis.RedisError) -> StoreUnavailable:
    """The store's error for a redis-py one (raise it ``from exc``)."""
    return StoreUnavailable(f"{type(exc).__name__}: {exc}")


# The writes a client is told about, made durable on replicas when `Durability` is on: a
# run's accept (recorded with its session, or on its own), its end (with the messages it
# appends) and a transcript append outside a run.
ACKNOWLEDGED_SCRIPTS = ("start_run", "submit_run", "finish_run", "transcript_append")
# Of those, the ones whose shortfall is refused (`NotReplicated`) when run on their own.
REFUSED_WHEN_SHORT = ("start_run", "submit_run")
# At most one WARNING per this many seconds for writes that WAIT found short of replicas.
SHORT_LOG_EVERY_S = 10.0


def _script_sha(name: str) -> str:
    return hashlib.sha1(load_lua(name).source.encode()).hexdigest()


class NotReplicated(StoreUnavailable):
    """A run's accept is on the primary but WAIT found fewer replicas than asked in time:
    the client is answered 503 (retry, with the same idempotency key)."""


class Durability:
    """How many replicas must hold an acknowledged write before its answer (``replicas``,
    0: off) and how long WAIT may take for them (``timeout_ms``): the store client's one
    seam for it (see the module's docstring). Counts the writes WAIT found short."""

    def __init__(self, replicas: int = 0, timeout_ms: int = 1000) -> None:
        if replicas < 0 or (replicas and timeout_ms < 1):
            raise ValueError("replicas >= 0 and, with replicas, a timeout of 1 ms or more")
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.acknowledged_shas = frozenset(_script_sha(n) for n in ACKNOWLEDGED_SCRIPTS)
        self.refused_shas = frozenset(_script_sha(n) for n in REFUSED_WHEN_SHORT)
        self.short = 0  # writes that reached fewer replicas than asked, since start
        self.refused = 0  # of those, the accepts refused (`NotReplicated`)
        self._lock = threading.Lock()
        self._short_unlogged = 0
        self._logged_at = float("-inf")

    def acknowledged(self, args: tuple[Any, ...]) -> bool:
        """Whether the command ``args`` is an acknowledged write to confirm (never when off)."""
        return bool(
            self.replicas
            and len(args) > 1
            and args[0] == "EVALSHA"
            and str(args[1]) in self.acknowledged_shas
        )

    def refuses(self, args: tuple[Any, ...]) -> bool:
        """Whether a shortfall of the acknowledged write ``args`` is refused on its own."""
        return str(args[1]) in self.refused_shas

    def wait_args(self) -> tuple[Any, ...]:
        """The WAIT command that confirms the connection's writes."""
        return ("WAIT", self.replicas, self.timeout_ms)

    def confirmed(self, reply: Any, *, refuse: bool = False) -> None:
        """Take WAIT's reply (the replicas that have the writes, or its error): fewer than
        asked are counted, then refused (`NotReplicated`) with ``refuse`` or logged; the
        write stands either way."""
        acked = reply if isinstance(reply, int) else -1
        if acked >= self.replicas:
            return
        shown = f"{acked} replicas" if acked >= 0 else f"an error ({reply})"
        with self._lock:
            self.short += 1
            if refuse:
                self.refused += 1
            else:
                self._short_unlogged += 1
            now = time.monotonic()
            if refuse or now - self._logged_at < SHORT_LOG_EVERY_S:
                count = 0
            else:
                count, self._short_unlogged, self._logged_at = self._short_unlogged, 0, now
        if refuse:
            raise NotReplicated(
                f"the write reached {shown} within {self.timeout_ms} ms, not the "
                f"{self.replicas} SWITCHBOARD_REDIS_WAIT_REPLICAS asks for"
            )
        if count:
            log.warning(
                "%d acknowledged writes reached fewer than %d replicas within %d ms (%s on "
                "the last): they stand on the primary only, and a failover may lose them",
                count,
                self.replicas,
                self.timeout_ms,
                shown,
            )


# The store's clients unless told otherwise: no WAIT.
NO_WAIT = Durability()


class CrossSlotError(RuntimeError):
    """A script or transaction named keys of more than one hash slot: a bug in the store
    (a Redis Cluster refuses it with CROSSSLOT), found on any Redis with the slot check on
    (``SWITCHBOARD_SLOT_CHECK``). Not a `StoreUnavailable`: nothing retries it."""


# Commands whose every argument after the name is a key; any other keyed command's key is
# its first argument, and a script's keys are counted by its third.
_ALL_KEYS = frozenset({"DEL", "UNLINK", "EXISTS", "TOUCH"})
_SCRIPTS = frozenset({"EVALSHA", "EVAL"})


def command_keys(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The keys a command names, as the slot check reads them (none for a command that
    names none the check cares about: PUBLISH's channel, WAIT)."""
    name = str(args[0]).upper()
    if name in _SCRIPTS:
        return args[3 : 3 + int(args[2])]
    if name in _ALL_KEYS:
        return args[1:]
    if name in ("PUBLISH", "WAIT", "MULTI", "EXEC", "PING", "INFO", "SCRIPT") or len(args) < 2:
        return ()
    return args[1:2]


def check_one_slot(what: str, keys: Any) -> None:
    """Raise `CrossSlotError` unless every key in ``keys`` is in one hash slot."""
    slots = {key_slot(k if isinstance(k, bytes) else str(k).encode()) for k in keys}
    if len(slots) > 1:
        shown = ", ".join(sorted(str(k) for k in keys)[:6])
        raise CrossSlotError(f"{what} spans {len(slots)} hash slots: {shown}")


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
    raises `StoreUnavailable`; its other commands may have run, and the store's steps are
    retried and idempotent."""

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
            return super().execute(raise_on_error)
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
    # What follows its pool's primary (a Sentinel group's, a cluster slot's); stopped on close.
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


class SentinelBlockingPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """redis-py's sentinel pool (each new connection asks the sentinels for the primary)
    with the blocking pool's wait for a free connection."""


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
    """`NewestSentinel`'s rule for the api's async clients."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
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
        _cut_connections(pool)


def _cut_connections(pool: Any) -> None:
    """Shut down the socket of every connection the pool made (idle or in use)."""
    for _ in range(3):  # an async pool's lists change under us: copy them again
        try:
            made = getattr(pool, "_connections", None)  # a blocking pool lists all here
            if made is None:
                made = [*pool._available_connections, *pool._in_use_connections]
            made = list(made)
            break
        except RuntimeError:
            continue
    else:
        return  # the next check cuts them
    for conn in made:
        sock = getattr(conn, "_sock", None)  # a sync connection's socket
        writer = getattr(conn, "_writer", None)  # an async one's stream
        if writer is not None:
            sock = writer.get_extra_info("socket")
        if sock is not None:
            _shut_down(sock)


def _shut_down(sock: Any) -> None:
    """Shut the socket down for both directions, through a duplicate of its descriptor:
    an event loop's transport socket (uvloop's) refuses ``shutdown()`` itself, and a
    shutdown acts on the socket, whichever descriptor names it."""
    with contextlib.suppress(OSError, ValueError):
        fd = sock.fileno()
        if fd < 0:
            return  # closed meanwhile
        with socket.socket(fileno=os.dup(fd)) as dup:
            dup.shutdown(socket.SHUT_RDWR)


def _sentinel_kwargs(retry: Any) -> dict[str, Any]:
    return {
        "socket_timeout": SENTINEL_TIMEOUT_S,
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        "retry": retry,
        "driver_info": DRIVER_INFO,
    }


def _sentinels(parsed: SentinelUrl) -> NewestSentinel:
    """The URL's sentinels, asked by the sync clients' pools (over TLS for a
    ``rediss+sentinel://`` URL, as are the connections to the primary)."""
    kwargs = {**_sentinel_kwargs(Retry(NoBackoff(), 0)), **parsed.sentinel_kwargs()}
    return NewestSentinel(  # type: ignore[no-untyped-call]
        list(parsed.sentinels), sentinel_kwargs=kwargs, **parsed.connection_kwargs()
    )


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
    url: str, *, scripts_on_connect: bool = False, prefix: str | None = None
) -> tuple[redis.BlockingConnectionPool, Follower | None]:
    """A pool with keepalive and health checks for the store's client, and what follows
    its primary (none for one Redis).

    With every connection in use (a worker with more threads than the pool holds, all
    calling at once), a caller waits up to 20 s for one instead of failing. For a
    ``redis+sentinel://`` URL the pool's connections go to the primary the sentinels name;
    for a ``redis+cluster://`` one, to the primary that owns the slot of the key
    ``prefix`` (its hash tag: `cluster`). With ``scripts_on_connect`` each connection
    loads every store script as it connects (`load_scripts_on_connect`)."""
    pool_options = dict(_POOL_OPTIONS)
    if scripts_on_connect:
        pool_options["redis_connect_func"] = load_scripts_on_connect
    parsed = parse_redis_url(url)
    if parsed is None:
        options = plain_url_options(url, pool_options)
        return redis.BlockingConnectionPool.from_url(url, **options), None
    if isinstance(parsed, ClusterUrl):
        return _slot_owner_pool(redis.BlockingConnectionPool, parsed, prefix, pool_options)
    options = {**parsed.connection_kwargs(), **pool_options, "is_master": True}
    pool = SentinelBlockingPool(parsed.master, _sentinels(parsed), **options)  # type: ignore[no-untyped-call]
    return pool, follow_primary(pool)


def connect(
    url: str,
    *,
    fast_paths: bool = True,
    durability: Durability = NO_WAIT,
    prefix: str | None = None,
    slot_check: bool = False,
) -> StoreRedis | HeldStoreRedis:
    """The store's sync client for ``url``: thread-held connections with ``fast_paths``,
    redis-py's plain pooled client without (both on a sentinel pool for a sentinel URL,
    on the slot owner's for a cluster URL, whose keys are under ``prefix``); its
    acknowledged writes confirmed on replicas as ``durability`` says; with ``slot_check``
    its scripts and transactions must each name keys of one hash slot (`CrossSlotError`)."""
    pool, following = blocking_pool(url, scripts_on_connect=fast_paths, prefix=prefix)
    # redis-py types its constructors as returning Redis; they return the class called on.
    client: StoreRedis | HeldStoreRedis
    if fast_paths:
        client = cast(HeldStoreRedis, HeldStoreRedis.from_pool(pool))
    else:
        client = cast(StoreRedis, StoreRedis.from_pool(pool))
    client.durability = durability
    client.following = following
    client.slot_check = slot_check
    return client


def _slot_owner_pool(
    pool_class: Any,
    parsed: ClusterUrl,
    prefix: str | None,
    options: dict[str, Any],
    *,
    asynchronous: bool = False,
) -> tuple[Any, Follower]:
    """A pool of ``pool_class`` whose connections go to the primary that owns the slot of
    the store's keys (the key ``prefix`` is their hash tag), and what follows it as it
    moves; over TLS for a ``rediss+cluster://`` URL."""
    if not prefix or "{" not in prefix:
        raise ValueError(f"on a Redis Cluster the key prefix carries a {{hash tag}}: {prefix!r}")
    connection_class: type[Any]
    if asynchronous:
        connection_class = AsyncSSLSlotOwnerConnection if parsed.tls else AsyncSlotOwnerConnection
    else:
        connection_class = SSLSlotOwnerConnection if parsed.tls else SlotOwnerConnection
    owner = SlotOwner(parsed, prefix)
    pool = pool_class(
        connection_class=connection_class,
        slot_owner=owner,
        **parsed.connection_kwargs(),
        **options,
    )
    return pool, follow_slot_owner(pool, owner, _cut_connections)


def dedicated_connection(client: redis.Redis) -> redis.Connection:
    """A connection of its own (not from the pool) to where ``client``'s pool connects:
    the same server, database and credentials; for a sentinel pool, the current primary."""
    pool = client.connection_pool
    return cast(redis.Connection, pool.connection_class(**pool.connection_kwargs))


def connect_plain(url: str, *, prefix: str | None = None, **options: Any) -> StoreRedis:
    """A plain store client with its own connection options (a probe, a broker's lists);
    on a cluster, to the owner of the slot of the keys under ``prefix``."""
    parsed = parse_redis_url(url)
    if parsed is None:
        options = plain_url_options(url, options)
        return cast(StoreRedis, StoreRedis.from_url(url, driver_info=DRIVER_INFO, **options))
    if isinstance(parsed, ClusterUrl):
        options = {"driver_info": DRIVER_INFO, **options}
        pool, following = _slot_owner_pool(redis.ConnectionPool, parsed, prefix, options)
        plain = cast(StoreRedis, StoreRedis.from_pool(pool))
    else:
        plain = _sentinels(parsed).master_for(  # type: ignore[no-untyped-call]
            parsed.master, redis_class=StoreRedis, driver_info=DRIVER_INFO, **options
        )
        following = follow_primary(plain.connection_pool)
    plain.following = following
    return plain


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


def connect_async(url: str, *, prefix: str | None = None, **options: Any) -> AsyncStoreRedis:
    """An async store client for ``url`` with the connection ``options`` given (for a
    sentinel URL, on redis-py's async sentinel pool; for a cluster URL, on connections to
    the owner of the slot of the keys under ``prefix``)."""
    parsed = parse_redis_url(url)
    if parsed is None:
        options = plain_url_options(url, options)
        return cast(
            AsyncStoreRedis, AsyncStoreRedis.from_url(url, driver_info=DRIVER_INFO, **options)
        )
    if isinstance(parsed, ClusterUrl):
        options = {"driver_info": DRIVER_INFO, **options}
        pool, following = _slot_owner_pool(
            aioredis.ConnectionPool, parsed, prefix, options, asynchronous=True
        )
        client = cast(AsyncStoreRedis, AsyncStoreRedis.from_pool(pool))
        client.following = following
        return client
    kwargs = {**_sentinel_kwargs(AsyncRetry(NoBackoff(), 0)), **parsed.sentinel_kwargs()}
    sentinels = AsyncNewestSentinel(  # type: ignore[no-untyped-call]
        list(parsed.sentinels), sentinel_kwargs=kwargs, **parsed.connection_kwargs()
    )
    client = sentinels.master_for(
        parsed.master, redis_class=AsyncStoreRedis, driver_info=DRIVER_INFO, **options
    )
    client.following = follow_primary(client.connection_pool, checker=_sentinels(parsed))
    return cast(AsyncStoreRedis, client)
