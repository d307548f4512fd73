"""The metrics hash and the gauges read beside it, and the broker's queue lengths.

Counters live in one hash (``Keyspace.metrics``) that every process adds to; what the
fields mean is `switchboard.shared.metrics`. Adding is best effort: a counter is an
observation, so a failed ``HINCRBY`` is logged and never fails the step that counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from redis import Redis

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.client import connect_plain
from switchboard.shared.store.keyspace import Keyspace

log = logging.getLogger("switchboard.metrics")


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape's reading: the raw counter hash and the run gauges."""

    counters: dict[bytes | str, bytes | str]
    parked_runs: int
    active_runs: int


class CounterStore:
    """The cluster's counters (one hash) and the run gauges, read in one round trip."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks

    def add(self, field: str, amount: int = 1) -> None:
        """Add to a counter field; a Redis failure is logged, never raised."""
        try:
            self.redis.hincrby(self.ks.metrics, field, amount)
        except StoreUnavailable as exc:
            log.warning("metric %s not counted: %s", field, exc.fields.get("detail", exc))

    def snapshot(self) -> MetricsSnapshot:
        """The counter hash and the parked and active run counts, in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.ks.metrics)
        pipe.zcard(self.ks.parked_runs)
        pipe.zcard(self.ks.active_runs)
        raw, parked, active = pipe.execute()
        return MetricsSnapshot(dict(raw), int(parked), int(active))


class ListLengths:
    """Lengths of named lists (the broker's queues), in one pipeline."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    @classmethod
    def from_url(cls, url: str) -> ListLengths:
        """Lengths read on a client of their own (a broker that is not the store's Redis)."""
        return cls(connect_plain(url, socket_timeout=10, socket_connect_timeout=5))

    def read(self, names: Sequence[str]) -> list[int]:
        """The length of each list in ``names`` (0 for a missing one), in order."""
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.llen(name)
        return [int(n) for n in pipe.execute()]
