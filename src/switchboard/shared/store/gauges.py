"""The run gauges read from Redis at scrape time, and the broker's queue lengths.

A gauge is read when Prometheus scrapes, never written by a run: the runs parked on a wait
(the parked index) and the lanes held (the lease index: a run running, parked, or handed its
lane and about to be claimed), each summed over every slot group. The counters are the
processes' own (`switchboard.shared.metrics`), not Redis's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis import Redis

from switchboard.shared.store.client import connect_plain
from switchboard.shared.store.keyspace import Keyspace


@dataclass(frozen=True)
class RunGauges:
    """One scrape's reading of the run gauges."""

    parked_runs: int
    active_runs: int


class GaugeStore:
    """The run gauges, read in one round trip."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks

    def read(self) -> RunGauges:
        """The parked runs and the lanes held (every group's summed), in one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        for group in self.ks.every_group():
            pipe.zcard(group.parked_runs)
            pipe.zcard(group.lane_leases)
        replies = [int(n) for n in pipe.execute()]
        return RunGauges(parked_runs=sum(replies[0::2]), active_runs=sum(replies[1::2]))


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
