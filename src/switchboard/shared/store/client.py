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
"""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.asyncio as aioredis
from redis.driver_info import DriverInfo
from redis.exceptions import NoScriptError, WatchError

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.thread_held import ThreadHeldRedis

DRIVER_INFO = DriverInfo(lib_version=redis.__version__)

# Errors redis-py's helpers handle themselves; every other RedisError becomes ours.
_PASSED_THROUGH = (NoScriptError, WatchError)


def unavailable(exc: redis.RedisError) -> StoreUnavailable:
    """The store's error for a redis-py one (raise it ``from exc``)."""
    return StoreUnavailable(f"{type(exc).__name__}: {exc}")


class StorePipeline(redis.client.Pipeline):
    """A pipeline whose failed ``execute`` raises `StoreUnavailable`."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued commands; a Redis error is raised as `StoreUnavailable`."""
        try:
            return super().execute(raise_on_error)
        except _PASSED_THROUGH:
            raise
        except redis.RedisError as exc:
            raise unavailable(exc) from exc


class _Translating(redis.Redis):
    """A client whose commands raise `StoreUnavailable` for a Redis error."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Run one command; a Redis error is raised as `StoreUnavailable`."""
        try:
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except _PASSED_THROUGH:
            raise
        except redis.RedisError as exc:
            raise unavailable(exc) from exc

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> StorePipeline:
        """A pipeline on this client's pool that translates its errors too."""
        return StorePipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


class StoreRedis(_Translating):
    """The plain store client: redis-py's own path, a pooled connection per command."""


class HeldStoreRedis(_Translating, ThreadHeldRedis):
    """The fast-path store client: each thread's commands on its own connection."""


def blocking_pool(url: str) -> redis.BlockingConnectionPool:
    """A pool with keepalive and health checks for the store's client.

    With every connection in use (a worker with more threads than the pool holds, all
    calling at once), a caller waits up to 20 s for one instead of failing."""
    return redis.BlockingConnectionPool.from_url(
        url,
        socket_keepalive=True,
        health_check_interval=25,
        socket_timeout=30,
        socket_connect_timeout=5,
        max_connections=512,
        timeout=20,
        driver_info=DRIVER_INFO,
    )


def connect(url: str, *, fast_paths: bool = True) -> StoreRedis | HeldStoreRedis:
    """The store's sync client for ``url``: thread-held connections with ``fast_paths``,
    redis-py's plain pooled client without."""
    pool = blocking_pool(url)
    # redis-py types its constructors as returning Redis; they return the class called on.
    if fast_paths:
        return cast(HeldStoreRedis, HeldStoreRedis.from_pool(pool))
    return cast(StoreRedis, StoreRedis.from_pool(pool))


def connect_plain(url: str, **options: Any) -> StoreRedis:
    """A plain store client with its own connection options (a probe, a broker's lists)."""
    return cast(StoreRedis, StoreRedis.from_url(url, driver_info=DRIVER_INFO, **options))


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


def connect_async(url: str, **options: Any) -> AsyncStoreRedis:
    """An async store client for ``url`` with the connection ``options`` given."""
    return cast(AsyncStoreRedis, AsyncStoreRedis.from_url(url, driver_info=DRIVER_INFO, **options))
