"""The api's async store clients wait for a free connection: a thousand commands under way
at once on one event loop all answer, on one Redis, a Sentinel group and a cluster.

redis-py's default async pool holds 100 connections and fails the command past them
("Too many connections", which the store raises as `StoreUnavailable`: an api answering a
few hundred waits at once said 503 with Redis idle). The store's async pools are blocking
ones, as its sync pool is: 512 connections, a wait of up to 20 s for one.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.shared.store.aio import AsyncStore
from switchboard.shared.store.client import connect_async
from switchboard.shared.store.keyspace import Keyspace
from switchboard_testkit.redis_cluster import RedisClusterGroup
from switchboard_testkit.redis_sentinel import RedisSentinelGroup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from faultkit import redis_sentinel_group

pytestmark = pytest.mark.integration

AT_ONCE = 1000  # ten times redis-py's default async pool, twice the store's


@pytest.fixture(scope="module")
def sentinel_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelGroup]:
    """A Sentinel group of this module's own (nothing is failed over)."""
    with redis_sentinel_group(tmp_path_factory.mktemp("pool-wait-group")) as group:
        yield group


async def answered_at_once(url: str, key: str) -> list[bytes | None]:
    """`AT_ONCE` reads of ``key`` started together on one async store client."""
    client = connect_async(url, socket_timeout=10)
    try:
        await client.set(key, b"here")
        return await asyncio.gather(*(client.get(key) for _ in range(AT_ONCE)))
    finally:
        await client.aclose()


def test_a_thousand_commands_at_once_all_answer_on_one_redis(redis_url: str) -> None:
    assert asyncio.run(answered_at_once(redis_url, "pool-wait")) == [b"here"] * AT_ONCE


def test_a_thousand_commands_at_once_all_answer_on_a_sentinel_group(
    sentinel_group: RedisSentinelGroup,
) -> None:
    assert asyncio.run(answered_at_once(sentinel_group.url, "pool-wait")) == [b"here"] * AT_ONCE


def test_a_thousand_commands_at_once_all_answer_on_a_cluster(
    steady_cluster: RedisClusterGroup,
) -> None:
    assert asyncio.run(answered_at_once(steady_cluster.url, "pool-wait")) == [b"here"] * AT_ONCE


def test_a_thousand_run_waits_at_once_read_their_runs(redis_url: str) -> None:
    """The api's run waiter, as a burst of `agent.wait` calls uses it: every wait reads
    its (unknown) run and answers None, none fails for want of a connection."""

    async def waits() -> list[object]:
        store = AsyncStore.from_url(redis_url, Keyspace())
        waiter = store.run_waiter()
        await waiter.start()
        try:
            return await asyncio.gather(
                *(waiter.wait(f"no-such-run-{i}", 0.0) for i in range(AT_ONCE)),
                return_exceptions=True,
            )
        finally:
            await waiter.stop()
            await store.aclose()

    assert asyncio.run(waits()) == [None] * AT_ONCE


def test_connections_connecting_together_ask_the_sentinels_once(
    sentinel_group: RedisSentinelGroup,
) -> None:
    """Hundreds of connections opened at once (as after a failover) share one lookup of the
    primary instead of asking every sentinel each."""

    async def lookups() -> int:
        client = connect_async(sentinel_group.url, socket_timeout=10)
        manager = client.connection_pool.sentinel_manager
        ask, asked = manager.ask_every_sentinel, 0

        async def counted(service_name: str) -> tuple[str, int]:
            nonlocal asked
            asked += 1
            return await ask(service_name)

        manager.ask_every_sentinel = counted
        try:
            await asyncio.gather(*(client.get("pool-wait") for _ in range(300)))
        finally:
            await client.aclose()
        return asked

    assert 1 <= asyncio.run(lookups()) <= 3
