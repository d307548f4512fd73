"""The sizing model of docs/scaling.md: what N workers and K Redis shards carry.

Pure arithmetic over measured figures (the `scale` scenario's runs/s per worker core and
Redis commands per run, `redis-benchmark`'s one-shard ceiling): the service carries the
smaller of what its workers run and what its shards serve, each shard kept below its
ceiling by a headroom factor.
"""

from __future__ import annotations

from dataclasses import dataclass


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
