"""How a redis-py error becomes the store's: one rule for every store client (`client`,
`router`).

Any ``RedisError`` is raised again as `StoreUnavailable` (``from`` it), but for the two
redis-py's own helpers act on (`PASSED_THROUGH`): ``NoScriptError`` (`Script` loads the
script and runs it again) and ``WatchError`` (an optimistic transaction lost its race).

So is one error that is not redis-py's, on the api's event loop (`closed_transport`):
uvloop's for a write on a connection that closed under redis-py.
"""

from __future__ import annotations

import redis
from redis.exceptions import NoScriptError, WatchError

from switchboard.shared.errors import StoreUnavailable

# Errors redis-py's helpers handle themselves; every other RedisError becomes ours.
PASSED_THROUGH = (NoScriptError, WatchError)


def closed_transport(exc: BaseException) -> bool:
    """Whether ``exc`` is uvloop's refusal to write on a transport that has closed: the
    server, a failover or a cut (`follow.cut_connections`) closed a connection between
    redis-py's check of it and its write (most often the first command of a connection it
    has just opened). redis-py closes the connection and raises it as it is: a
    ``RuntimeError`` ("unable to perform operation on <TCPTransport closed=True …>; the
    handler is closed"), where asyncio's own transports fail the write with an ``OSError``,
    which redis-py raises as ``ConnectionError``."""
    return isinstance(exc, RuntimeError) and "the handler is closed" in str(exc)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc``, raised by redis-py, means the store is away: any ``RedisError`` (but
    those `PASSED_THROUGH`, caught before), or a closed transport."""
    return isinstance(exc, redis.RedisError) or closed_transport(exc)


def unavailable(exc: Exception) -> StoreUnavailable:
    """The store's error for a redis-py one or a closed transport (raise it ``from exc``)."""
    return StoreUnavailable(f"{type(exc).__name__}: {exc}")
