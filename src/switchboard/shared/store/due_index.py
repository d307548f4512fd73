"""Due indexes across slot groups: sorted sets of ids scored by when they are due (ms),
one per group (`GroupKeys`), read in one pipeline (one round trip per primary).

`take_due` takes what is due with `pending_take_due.lua` (each member pushed on in the
same step, so of two sweeps one takes it); `members_due` only reads.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis import Redis

from switchboard.shared.store.codec import as_text
from switchboard.shared.store.lua_scripts import LuaScripts


def take_due(
    redis: Redis,
    lua: LuaScripts,
    indexes: Iterable[str],
    *,
    now_ms: int,
    recheck_ms: int,
    limit: int,
) -> list[str]:
    """The members due by ``now_ms`` in each of ``indexes``, each pushed ``recheck_ms``
    on in the step that takes it (at most ``limit`` per index)."""
    pipe = redis.pipeline(transaction=False)
    for due in indexes:
        lua["pending_take_due"](
            client=pipe, due=due, now=now_ms, limit=limit, recheck_ms=recheck_ms
        )
    return [as_text(v) for taken in pipe.execute() for v in taken]


def members_due(redis: Redis, indexes: Iterable[str], *, before_ms: int, limit: int) -> list[str]:
    """The members of each of ``indexes`` scored up to ``before_ms``, the earliest first
    in each, at most ``limit`` per index."""
    pipe = redis.pipeline(transaction=False)
    for index in indexes:
        pipe.zrangebyscore(index, "-inf", before_ms, start=0, num=limit)
    return [as_text(r) for rows in pipe.execute() for r in rows]
