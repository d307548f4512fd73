"""Tool-server slots (`ToolSlotStore`, `SlotLimiter`) on a private Redis: a fleet-wide
semaphore with leases. Never more than ``limit`` held; a dead holder's slot comes back when
its lease lapses; a slot given back wakes a waiting call at once; a wait has a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from switchboard.shared.config import Settings
from switchboard.shared.runtime.slot_limiter import NoSlot, SlotLimiter
from switchboard.shared.store import Store
from switchboard_testkit.redis_cluster import RedisClusterGroup

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_url: str) -> Iterator[Store]:
    """The store on the private Redis."""
    s = Store.from_url(redis_url, slot_check=True)
    yield s
    s.close()


def test_never_more_than_limit_held(store: Store) -> None:
    """Twenty holders racing for three slots: three get one; a release lets one more in."""
    slots = store.tool_slots
    with ThreadPoolExecutor(20) as pool:
        got = list(pool.map(lambda i: slots.acquire("srv", f"h{i}", 3, 30_000), range(20)))
    winners = [f"h{i}" for i, a in enumerate(got) if a.taken]
    assert len(winners) == 3
    assert max(a.held for a in got) == 3
    assert slots.held("srv") == 3
    assert not slots.acquire("srv", "late", 3, 30_000).taken
    assert slots.acquire("srv", winners[0], 3, 30_000).taken, "a holder keeps its slot"
    assert slots.release("srv", winners[0])
    assert slots.acquire("srv", "late", 3, 30_000).taken
    assert slots.held("srv") == 3
    assert slots.held("other") == 0, "servers have slots of their own"


def test_a_dead_holders_slot_comes_back_after_its_lease(store: Store) -> None:
    """A holder that never releases (its worker died) loses its slot once its lease lapses;
    a renewed lease keeps it, a lapsed one is not renewed."""
    slots = store.tool_slots
    assert slots.acquire("srv", "dead", 1, 300).taken
    assert slots.acquire("srv", "alive", 1, 300).taken is False
    time.sleep(0.2)
    assert slots.renew("srv", "dead", 300), "renewed within its lease"
    time.sleep(0.2)
    assert not slots.acquire("srv", "alive", 1, 300).taken, "the renewal pushed the lease on"
    time.sleep(0.2)
    assert slots.held("srv") == 0
    assert not slots.renew("srv", "dead", 300), "a lapsed lease is not renewed"
    assert slots.acquire("srv", "alive", 1, 30_000).taken
    assert not slots.release("srv", "dead")
    ttl = store.redis.pttl(store.ks.tool_slots("srv"))
    assert 0 < ttl <= 30_000, "the key lives as long as its last lease"


def test_a_released_slot_wakes_a_waiting_call_at_once(store: Store) -> None:
    """A call waiting for the one slot (its backoff grown past a second) takes it within
    a few ms of another call of the process giving it back, not at its next ask."""
    limiter = SlotLimiter(store.tool_slots, "srv", 1, max_backoff_s=5.0)

    async def scenario() -> tuple[float, list[int]]:
        waiting: list[int] = []
        await limiter.acquire("first", 5)
        second = asyncio.create_task(limiter.acquire("second", 10, waiting.append))
        await asyncio.sleep(1.5)  # the waiter's backoff is now past a second
        assert not second.done() and waiting == [1]
        released = time.monotonic()
        await limiter.release("first")
        await second
        return time.monotonic() - released, waiting

    took, waiting = asyncio.run(scenario())
    assert took < 0.3, f"the waiter took the slot {took:.3f}s after the release"
    assert waiting == [1, -1]
    assert store.tool_slots.held("srv") == 1


def test_a_wait_past_its_timeout_is_no_slot(store: Store) -> None:
    """With every slot held elsewhere, a call waits its timeout and gets `NoSlot`; it
    holds nothing afterwards."""
    store.tool_slots.acquire("srv", "elsewhere", 1, 30_000)
    limiter = SlotLimiter(store.tool_slots, "srv", 1)
    started = time.monotonic()
    with pytest.raises(NoSlot, match="busy"):
        asyncio.run(limiter.acquire("me", 0.3))
    assert 0.3 <= time.monotonic() - started < 2
    assert store.tool_slots.held("srv") == 1


def test_tool_slots_on_a_redis_cluster(steady_cluster: RedisClusterGroup) -> None:
    """On a Redis Cluster with the default slot groups, each server's slots live on the
    primary of its key's slot (servers spread over the primaries) and hold their limit."""
    settings = Settings(redis_url=steady_cluster.url)
    assert settings.slot_groups is not None and settings.slot_groups > 1
    store = Store.from_url(
        steady_cluster.url, prefix=settings.key_prefix, groups=settings.slot_groups
    )
    try:
        servers = [f"srv{n}" for n in range(12)]
        for server in servers:
            got = [store.tool_slots.acquire(server, f"h{i}", 2, 30_000).taken for i in range(3)]
            assert got == [True, True, False], server
            assert store.tool_slots.held(server) == 2
        owners = {steady_cluster.primary_for(store.ks.tool_slots(s)).port for s in servers}
        assert len(owners) > 1, "the servers' slots spread over the primaries"

        async def wait_then_take() -> None:
            limiter = SlotLimiter(store.tool_slots, "srv0", 2)
            waiting = asyncio.create_task(limiter.acquire("h2", 5))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            await limiter.release("h0")
            await asyncio.wait_for(waiting, 2)

        asyncio.run(wait_then_take())
        assert store.tool_slots.held("srv0") == 2
    finally:
        store.close()
