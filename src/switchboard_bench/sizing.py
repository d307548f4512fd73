"""The sizing model of docs/scaling.md: what N workers and K Redis shards carry.

Pure arithmetic over measured figures (the `scale` scenario's runs/s per worker core and
Redis commands per run, `redis-benchmark`'s one-shard ceiling): the service carries the
smaller of what its workers run and what its shards serve, each shard kept below its
ceiling by a headroom factor and the shards together by their balance. One deployment's
state spreads over a cluster's primaries by slot group, so the balance is first how the
groups fall on the primaries (`groups_dealt_evenly`, `groups_by_slot_range`,
`busiest_over_mean`), then what the measured split adds to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.slots import key_slot

SLOTS = 16384  # a Redis Cluster's hash slots


@dataclass(frozen=True)
class Capacity:
    """Runs per second a deployment carries, and which side limits it."""

    worker_runs_per_s: float
    shard_runs_per_s: float

    @property
    def runs_per_s(self) -> float:
        """The smaller of the two sides: the deployment's capacity."""
        return min(self.worker_runs_per_s, self.shard_runs_per_s)

    @property
    def bound_by(self) -> str:
        """``workers`` or ``redis``: the side that runs out first."""
        return "workers" if self.worker_runs_per_s <= self.shard_runs_per_s else "redis"


def shard_runs_per_s(ceiling_ops_per_s: float, ops_per_run: float, headroom: float = 0.5) -> float:
    """Runs per second one Redis shard serves: ``headroom`` of its ceiling (commands/s)
    spent at ``ops_per_run`` commands each."""
    if ops_per_run <= 0:
        raise ValueError("ops_per_run must be positive")
    if not 0 < headroom <= 1:
        raise ValueError("headroom must be in (0, 1]")
    return ceiling_ops_per_s * headroom / ops_per_run


def capacity(
    *,
    workers: int,
    runs_per_s_per_worker: float,
    shards: int,
    ceiling_ops_per_s: float,
    ops_per_run: float,
    headroom: float = 0.5,
    shard_balance: float = 1.0,
) -> Capacity:
    """What ``workers`` worker processes (one core each) and ``shards`` Redis shards carry.

    Workers scale linearly (they share nothing but Redis and the broker). Shards scale by
    ``shard_balance`` (1.0: load spread evenly over them; below 1 when the busiest shard
    takes more than its share, e.g. 0.8 for 25% over the mean)."""
    if workers < 0 or shards < 1:
        raise ValueError("workers must be ≥ 0 and shards ≥ 1")
    if not 0 < shard_balance <= 1:
        raise ValueError("shard_balance must be in (0, 1]")
    per_shard = shard_runs_per_s(ceiling_ops_per_s, ops_per_run, headroom)
    return Capacity(
        worker_runs_per_s=workers * runs_per_s_per_worker,
        shard_runs_per_s=shards * per_shard * shard_balance,
    )


def workers_for(runs_per_s: float, runs_per_s_per_worker: float) -> int:
    """Worker processes (cores) needed for ``runs_per_s``, rounded up."""
    if runs_per_s_per_worker <= 0:
        raise ValueError("runs_per_s_per_worker must be positive")
    whole = runs_per_s / runs_per_s_per_worker
    return max(1, int(whole) + (whole > int(whole)))


def groups_dealt_evenly(groups: int, shards: int) -> list[int]:
    """Slot groups per shard when they are dealt out as evenly as whole groups allow
    (each group's slot moved to its shard): 64 over 10 is 7, 7, 7, 7, 6, 6, 6, 6, 6, 6."""
    if groups < 1 or shards < 1:
        raise ValueError("groups and shards must be ≥ 1")
    return [groups // shards + (i < groups % shards) for i in range(shards)]


def groups_by_slot_range(groups: int, shards: int, prefix: str = "sb:") -> list[int]:
    """Slot groups per shard when each of ``shards`` primaries owns an equal contiguous
    range of the slots (as ``redis-cli --cluster create`` deals them): each group lands
    where its hash tag's slot is, the store's own keys (`Keyspace`) telling the tags."""
    if groups < 1 or shards < 1:
        raise ValueError("groups and shards must be ≥ 1")
    counts = [0] * shards
    for group in Keyspace(prefix, groups).every_group():
        slot = key_slot(group.updated_all)
        counts[min(shards - 1, slot * shards // SLOTS)] += 1
    return counts


def busiest_over_mean(loads: Sequence[float]) -> float:
    """The busiest shard's load over the mean load: 1.0 when even; its inverse is the
    ``shard_balance`` of `capacity` (64 groups dealt over 10: 7 / 6.4 = 1.09, balance 0.91)."""
    total = math.fsum(loads)
    if not loads or total <= 0:
        raise ValueError("loads must hold a positive load")
    return max(loads) / (total / len(loads))
