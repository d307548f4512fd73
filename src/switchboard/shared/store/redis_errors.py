"""How a redis-py error becomes the store's: one rule for every store client (`client`,
`cluster`).

Any ``RedisError`` is raised again as `StoreUnavailable` (``from`` it), but for the two
redis-py's own helpers act on (`PASSED_THROUGH`): ``NoScriptError`` (`Script` loads the
script and runs it again) and ``WatchError`` (an optimistic transaction lost its race).

A write on a connection that closed under redis-py (a failover, a reset) is a
``ConnectionError`` from redis-py 8.2 on ("Connection closed by the server before write"),
on uvloop as on asyncio's own loop, so it is the store being away like any other.
"""

from __future__ import annotations

from redis.exceptions import NoScriptError, WatchError

from switchboard.shared.errors import StoreUnavailable

# Errors redis-py's helpers handle themselves; every other RedisError becomes ours.
PASSED_THROUGH = (NoScriptError, WatchError)


def unavailable(exc: Exception) -> StoreUnavailable:
    """The store's error for a redis-py one (raise it ``from exc``)."""
    return StoreUnavailable(f"{type(exc).__name__}: {exc}")
