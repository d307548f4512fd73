"""Pending flow steps: the sorted sets of steps enqueued and not yet run.

Each member names one step call (JSON ``[task, *args]``), scored by when the step is
presumed lost with its worker (ms). `PendingStepsQueue` adds a step as it enqueues it,
the step removes itself once it has run, and the lost-step sweep takes what is overdue.
A step is tracked in the slot group of its first argument (the id of the flow, spawn or
run it advances), so the tracking spreads with the state it concerns.
"""

from __future__ import annotations

from redis import Redis

from switchboard.shared.store import codec
from switchboard.shared.store.due_index import take_due
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts


class PendingStepStore:
    """The pending-steps sets (``GroupKeys.pending_steps``)."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._lua = LuaScripts(redis)

    def _key(self, member: str) -> str:
        """The set that tracks ``member``: its first argument's group's."""
        if self.ks.groups == 1:
            return self.ks.home.pending_steps
        call = codec.loads(member)
        near = str(call[1]) if len(call) > 1 else str(call[0])
        return self.ks.beside_id(near).pending_steps

    def add(self, member: str, lost_at_ms: int) -> None:
        """Track a step as pending until ``lost_at_ms`` (a step enqueued again moves on)."""
        self.redis.zadd(self._key(member), {member: lost_at_ms})

    def score(self, member: str) -> int | None:
        """When a step is presumed lost (ms), or None if it is not tracked."""
        score = self.redis.zscore(self._key(member), member)
        return None if score is None else int(score)

    def done(self, member: str, started_score: int) -> bool:
        """Forget a step that has run, unless it was enqueued again since it started
        (its score is no longer ``started_score``); True when forgotten."""
        res = self._lua["pending_done"](
            steps=self._key(member), member=member, started_score=started_score
        )
        return bool(int(res))

    def take_lost(self, now_ms: int, recheck_ms: int, limit: int = 500) -> list[str]:
        """The steps presumed lost by ``now_ms``, each pushed ``recheck_ms`` on (so one
        sweep takes it, and it comes back if that enqueue is lost too); at most ``limit``
        per slot group."""
        indexes = (group.pending_steps for group in self.ks.every_group())
        return take_due(
            self.redis, self._lua, indexes, now_ms=now_ms, recheck_ms=recheck_ms, limit=limit
        )
