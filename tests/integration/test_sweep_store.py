"""The sweep's own writes (switchboard.shared.store.sweeps.SweepStore) on a real Redis."""

from __future__ import annotations

import pytest
import redis

from switchboard.shared.store import Store

pytestmark = pytest.mark.integration


def test_mark_ran_records_the_time_a_sweep_ran(redis_client: redis.Redis) -> None:
    """mark_ran writes `<prefix>beat` field <name> = the time, as the sweep did before."""
    store = Store(redis_client, prefix="t:")
    store.sweeps.mark_ran("sweep", 1234)
    store.sweeps.mark_ran("sweep", 5678)
    assert redis_client.hgetall("t:beat") == {b"sweep": b"5678"}


def test_drop_lease_and_drop_parked_remove_only_the_named_entry(
    redis_client: redis.Redis,
) -> None:
    """drop_lease / drop_parked take one member out of the lease and parked indexes."""
    store = Store(redis_client, prefix="t:")
    redis_client.zadd("t:idx:leases", {"agent:main:a": 1, "agent:main:b": 2})
    redis_client.zadd("t:idx:parked", {"r1": 1, "r2": 2})
    store.sweeps.drop_lease("agent:main:a")
    store.sweeps.drop_parked("r2")
    assert redis_client.zrange("t:idx:leases", 0, -1) == [b"agent:main:b"]
    assert redis_client.zrange("t:idx:parked", 0, -1) == [b"r1"]
