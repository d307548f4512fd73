"""The metrics hash and the gauges read beside it, and the broker's queue lengths.

Counters live in a hash per slot group (``GroupKeys.metrics``): a step's scripts count in
their group's, the product's own `add` in the home group's, and a reading sums them all;
what the fields mean is `switchboard.shared.metrics`. Adding is best effort: a counter is an
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
            self.redis.hincrby(self.ks.home.metrics, field, amount)
        except StoreUnavailable as exc:
            log.warning("metric %s not counted: %s", field, exc.fields.get("detail", exc))

    def snapshot(self) -> MetricsSnapshot:
        """The counters (every group's summed) and the parked and active run counts, in
        one pipeline."""
        pipe = self.redis.pipeline(transaction=False)
        groups = self.ks.every_group()
        for group in groups:
            pipe.hgetall(group.metrics)
            pipe.zcard(group.parked_runs)
            pipe.zcard(group.active_runs)
        replies = pipe.execute()
        counters: dict[bytes | str, bytes | str] = {}
        parked = active = 0
        for at in range(0, len(replies), 3):
            for name, value in replies[at].items():
                counters[name] = _summed(counters.get(name), value)
            parked += int(replies[at + 1])
            active += int(replies[at + 2])
        return MetricsSnapshot(counters, parked, active)


def _summed(before: bytes | str | None, value: bytes | str) -> bytes | str:
    """A counter's value added to its sum so far (text, as Redis answers it)."""
    if before is None:
        return value
    return str(int(before) + int(value))


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
