"""The sweep's own writes: when it last ran, and index entries it finds stale.

The sweep (`shared.flows.sweeper`) reads its work through `RunStore` (expired leases,
overdue parked runs, the outbox); what it drops or marks here touches no run record.
"""

from __future__ import annotations

from redis import Redis

from switchboard.shared.store.keyspace import Keyspace


class SweepStore:
    """The beat marks hash and the lane-lease and parked-run indexes, as the sweep keeps them."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks

    def mark_ran(self, name: str, at_ms: int) -> None:
        """Record that the sweep ``name`` ran at ``at_ms`` (health checks read it)."""
        self.redis.hset(self.ks.beat_marks, name, at_ms)

    def last_ran(self, name: str) -> int | None:
        """When the sweep ``name`` last ran (ms), or None if it never has."""
        raw = self.redis.hget(self.ks.beat_marks, name)
        return None if raw is None else int(float(raw))

    def drop_lease(self, session_key: str) -> None:
        """Forget a lease entry whose lane has no holder any more."""
        self.redis.zrem(self.ks.beside(session_key).lane_leases, session_key)

    def drop_parked(self, run_id: str) -> None:
        """Forget a parked-index entry whose run is gone or no longer parked."""
        self.redis.zrem(self.ks.beside_id(run_id).parked_runs, run_id)
