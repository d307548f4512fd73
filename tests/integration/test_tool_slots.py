"""Tool-server slots (`ToolSlotStore`, `SlotLimiter`) on a private Redis: a fleet-wide
semaphore with leases. Never more than ``limit`` held; a dead holder's slot comes back when
its lease lapses; a slot given back wakes a waiting call at once; a wait has a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from toolcalls import open_store

from switchboard.shared.config import Settings
from switchboard.shared.runtime.slot_limiter import NoSlot, SlotLimiter
from switchboard.shared.store import Store
from switchboard.shared.store.tool_slots import ToolSlotStore
from switchboard_testkit.redis_cluster import RedisClusterGroup

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_url: str) -> Iterator[Store]:
    """The store on the private Redis."""
    s = open_store(redis_url)
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


def test_a_process_waiting_in_line_gets_the_next_slot(store: Store) -> None:
    """A slot given back goes to the process first in line, not to the process that gave
    it back and asks again at once; a process that takes one and has more calls waiting
    goes to the back of the line; one that stops waiting leaves it."""
    slots = store.tool_slots
    assert slots.acquire("srv", "b1", 1, 30_000).taken
    first = slots.acquire("srv", "a1", 1, 30_000, proc="A")
    assert (first.taken, first.ahead) == (False, 0), "A is first in line"
    assert slots.release("srv", "b1")
    behind = slots.acquire("srv", "b2", 1, 30_000)
    assert (behind.taken, behind.ahead) == (False, 1), "B asks behind A"
    assert slots.acquire("srv", "b2", 1, 30_000, proc="B").ahead == 1
    assert slots.acquire("srv", "a1", 1, 30_000, proc="A", stay=True).taken
    assert slots.release("srv", "a1")
    assert not slots.acquire("srv", "a2", 1, 30_000, proc="A").taken, "A went behind B"
    assert slots.acquire("srv", "b2", 1, 30_000, proc="B").taken
    assert slots.leave("srv", "A")
    assert store.redis.zcard(store.ks.tool_slot_queue("srv")) == 0, "B took its slot and left"


def test_a_process_gone_from_the_line_is_dropped(store: Store) -> None:
    """A process in line that stops asking (its worker died) is dropped after a while,
    so its place holds no slot back from the others."""
    slots = ToolSlotStore(store.redis, store.ks, queue_ms=300)
    assert slots.acquire("srv", "h", 1, 30_000).taken
    assert not slots.acquire("srv", "dead1", 1, 30_000, proc="dead").taken
    assert slots.release("srv", "h")
    assert not slots.acquire("srv", "x", 1, 30_000).taken, "the dead process is in line"
    time.sleep(0.4)
    assert slots.acquire("srv", "x", 1, 30_000).taken
    assert store.redis.zcard(store.ks.tool_slot_queue("srv")) == 0


def test_a_busy_process_does_not_starve_another(store: Store) -> None:
    """Two processes' limiters on 2 slots: one keeps 6 calls cycling through them (its
    own hand-over is at once); a call of the other, arriving meanwhile, gets one of the
    next slots given back, not after the busy one's many turns."""
    busy = SlotLimiter(store.tool_slots, "srv", 2)
    other = SlotLimiter(store.tool_slots, "srv", 2)
    granted: list[float] = []

    async def cycle(n: int) -> None:
        for i in range(10):
            holder = f"busy-{n}-{i}"
            await busy.acquire(holder, 30)
            granted.append(time.monotonic())
            await asyncio.sleep(0.1)
            await busy.release(holder)

    async def scenario() -> tuple[float, float]:
        cycling = [asyncio.create_task(cycle(n)) for n in range(6)]
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await other.acquire("other", 30)
        took = time.monotonic()
        await other.release("other")
        await asyncio.gather(*cycling)
        return started, took

    started, took = asyncio.run(scenario())
    meanwhile = sum(started <= t <= took for t in granted)
    assert meanwhile <= 4, f"the busy process took {meanwhile} slots while the other waited"
    assert granted[-1] > took, "the busy process was still cycling"


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
