"""State on a Redis Cluster (``redis+cluster://``): three private primaries, a replica each.

With one slot group the store's keys share one hash slot (the key prefix is the hash tag),
so redis-py's cluster client sends every command to the primary that owns it: scripts,
pipelines and transactions run as on one Redis; a planned ``CLUSTER FAILOVER`` of that
slot's primary is followed by the sync and async clients. With the default slot
groups the state spreads over every primary: a kill -9 of one of them under load, with a
real api, worker and beat, loses nothing (every acknowledged run ends ok exactly once, the
api answers 200 or 503 with Retry-After meanwhile, never a 500). Keys of many slots in the
store's client alone: test_cluster_routing.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from switchboard.shared.config import Settings
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store import Store
from switchboard.shared.store.client import connect_async, connect_plain
from switchboard.shared.store.durability import Durability
from switchboard.supervisor.redis_server import RedisServer
from switchboard_testkit.redis_cluster import RedisClusterGroup, RedisClusterNode
from switchboard_testkit.webhook_receiver import WebhookReceiver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from faultkit import Cluster, base_config, count_by, wait_until

# The same prefix the product gives itself on a cluster (`Settings`).
# The one-slot store's prefix (SWITCHBOARD_SLOT_GROUPS=1: every key under one hash tag), for
# the tests that follow one slot's owner; the service test runs the default slot groups.
PREFIX = Settings(redis_url="redis+cluster://h:1", slot_groups=1).key_prefix


def _owner(group: RedisClusterGroup) -> RedisClusterNode:
    return group.primary_for(PREFIX)


@pytest.mark.integration
def test_store_steps_run_on_the_slot_owner(steady_cluster: RedisClusterGroup) -> None:
    """Scripts, a pipeline of scripts and a transaction run through the cluster URL; every
    key lands on the slot's primary, none elsewhere; the probe and async clients read them
    there. With acknowledged writes on (SWITCHBOARD_REDIS_WAIT_REPLICAS=1) WAIT confirms
    them on the owner's replica."""
    prefix = PREFIX
    durability = Durability(replicas=1, timeout_ms=5000)
    store = Store.from_url(steady_cluster.url, prefix=prefix, durability=durability)
    try:
        session_id, created = store.sessions.ensure("agent:main:hook:cluster")
        assert created
        seq = store.transcripts.append(
            "agent:main:hook:cluster", {"role": "user", "content": "hi"}, now_ms=1
        )
        pipe = store.pipeline()  # scripts in a pipeline, on one connection
        store.sessions.touch("agent:main:hook:cluster", client=pipe)
        store.sessions.touch("agent:main:hook:other", client=pipe)
        pipe.execute()
        assert store.sessions.count() == 2
        assert store.sessions.agent_ids() == ["main"]  # SCAN: the owner holds every key
        assert [m["content"] for m in store.transcripts.all("agent:main:hook:cluster")] == ["hi"]
        owner = steady_cluster.primary_for(prefix)
        with owner.client() as direct:
            on_owner = {k.decode() for k in direct.keys(f"{prefix}*")}
        assert store.ks.session("agent:main:hook:cluster") in on_owner
        assert store.ks.transcript("agent:main:hook:cluster") in on_owner
        others = 0
        for node in steady_cluster.nodes:  # the other primaries hold none of them
            with node.client() as other:
                if node is not owner and other.info("replication")["role"] == "master":
                    others += 1
                    assert other.keys(f"{prefix}*") == []
        assert others == 2
        probe = connect_plain(steady_cluster.url, socket_timeout=3)
        assert probe.hget(store.ks.session("agent:main:hook:cluster"), "sessionId")
        probe.close()

        async def read_async() -> Any:
            client = connect_async(steady_cluster.url, socket_timeout=3)
            try:
                return await client.xlen(store.ks.transcript("agent:main:hook:cluster"))
            finally:
                await client.aclose()

        assert asyncio.run(read_async()) == seq
        assert session_id
        assert durability.short == 0  # the append's WAIT found the replica
        with owner.client() as direct:
            assert direct.info("commandstats")["cmdstat_wait"]["calls"] >= 1
        with steady_cluster.replica_of(owner).client() as replica:
            replica.readonly()
            assert replica.xlen(store.ks.transcript("agent:main:hook:cluster")) == seq
    finally:
        store.close()


@pytest.mark.integration
def test_planned_failover_moves_every_connection_to_the_new_owner(
    cluster_group: RedisClusterGroup,
) -> None:
    """``CLUSTER FAILOVER`` on the owner's replica: the old primary becomes a replica and
    answers the store's connections MOVED; they reconnect to the new owner, and every
    later write lands there."""
    store = Store.from_url(cluster_group.url, prefix=PREFIX)
    key = f"{PREFIX}probe"
    try:
        store.redis.set(key, "before")
        old = _owner(cluster_group)
        new = cluster_group.planned_failover(old, PREFIX)
        switched_at = time.monotonic()

        def written_on_new_owner() -> bool:
            with contextlib.suppress(StoreUnavailable):  # a moved connection fails once
                store.redis.set(key, "after")
            with new.client() as owner:
                return owner.get(key) == b"after"

        wait_until(written_on_new_owner, 10, "a write to reach the new owner", 0.05)
        print(f"\nwrites on the new owner {time.monotonic() - switched_at:.2f}s after the switch")
        for n in range(20):
            store.redis.set(key, f"final {n}")
        with new.client() as owner:
            assert owner.get(key) == b"final 19"
        with old.client() as demoted:
            assert demoted.info("replication")["role"] == "slave"
    finally:
        store.close()


@pytest.mark.integration
def test_planned_failover_moves_the_async_client_and_its_subscription(
    cluster_group: RedisClusterGroup,
) -> None:
    """The api's async client (run reads, the run-end subscription) follows the slot to
    its new owner; a message published on any node reaches the subscriber."""

    async def heard(subscriber: Any) -> bool:
        try:
            found = await subscriber.get_message(ignore_subscribe_messages=True, timeout=0.2)
        except redis.ConnectionError:
            await subscriber.aclose()  # as the api's waiter does: subscribe again
            await subscriber.subscribe(f"{PREFIX}events")
            return False
        return found is not None and found["data"] == b"hello"

    async def scenario() -> None:
        client = connect_async(cluster_group.url, socket_timeout=5)
        try:
            async with client.pubsub() as subscriber:
                await subscriber.subscribe(f"{PREFIX}events")
                assert (await subscriber.get_message(timeout=2))["type"] == "subscribe"
                await client.set(f"{PREFIX}async", "before")
                old = _owner(cluster_group)
                new = cluster_group.replica_of(old)
                with new.client() as replica:
                    replica.execute_command("CLUSTER", "FAILOVER")
                deadline = time.monotonic() + 20
                while _owner(cluster_group) is not new:
                    assert time.monotonic() < deadline, "the replica never took the slot"
                    await asyncio.sleep(0.1)
                switched_at = time.monotonic()
                while True:
                    assert time.monotonic() - switched_at < 10, "the async client stayed behind"
                    with contextlib.suppress(StoreUnavailable):
                        await client.set(f"{PREFIX}async", "after")
                    with new.client() as owner:
                        if owner.get(f"{PREFIX}async") == b"after":
                            break
                    await asyncio.sleep(0.05)
                other = next(n for n in cluster_group.nodes if n not in (old, new) and n.pid)
                while True:  # cluster pub/sub reaches every node's subscribers
                    assert time.monotonic() - switched_at < 10, "the subscriber heard nothing"
                    with other.client() as node:
                        node.publish(f"{PREFIX}events", "hello")
                    if await heard(subscriber):
                        break
        finally:
            await client.aclose()

    asyncio.run(scenario())


@pytest.mark.faults
def test_kill_of_a_primary_under_load_loses_nothing(
    cluster_group: RedisClusterGroup, tmp_path: Path, webhook: WebhookReceiver
) -> None:
    """kill -9 of one of the primaries the state is spread over (64 slot groups), with
    runs in flight: its replica takes over, the worker, beat and api follow without a
    restart, every acknowledged run ends ok once with an exact transcript, and meanwhile
    the api answers 200 or 503 + Retry-After."""
    from faultkit import FailoverProber as _Prober
    from faultkit import api_post as _post
    from faultkit import api_send as _send
    from faultkit import assert_failover_lost_nothing

    broker = RedisServer(tmp_path / "broker")
    broker.start()
    cluster = Cluster(cluster_group.url, tmp_path, base_config(webhook.url), broker_url=broker.url)
    try:
        cluster.worker(concurrency=16)
        cluster.beat()
        _, url = cluster.api()
        first = _send(url, "before-0", "hello")
        resp, _ = _post(
            url, "/rpc", {"method": "agent.wait", "params": {"runId": first, "timeoutMs": 30_000}}
        )
        assert resp.status_code == 200 and resp.json()["status"] == "ok", resp.text
        acknowledged = [first]
        for i in range(12):
            for j in range(2):
                acknowledged.append(_send(url, f"load-{i}", f"/sleep 1\nrun {i}.{j}"))
        # The state spreads over the primaries: the one holding the first load session's
        # slot group is killed (its other groups' sessions with it).
        group = cluster.services.store.ks.beside("agent:main:load-0")
        old = cluster_group.primary_for(group.events)
        with old.client() as primary:  # everything acknowledged is on the replica
            primary.set(f"{group.prefix}fence", "1")
            assert primary.wait(1, 2000) == 1
        with _Prober(url) as prober:
            cluster_group.kill(old)
            killed_at = time.monotonic()
            promoted = cluster_group.wait_promoted(old, timeout_s=30)
            promoted_s = time.monotonic() - killed_at
            prober.acknowledged_again()
        during = count_by((a[0], a[1]) for a in prober.answers)
        print(f"\n{promoted} took the slot after {promoted_s:.1f}s; answers during: {during}")
        assert_failover_lost_nothing(cluster, url, acknowledged, prober)
        assert all(proc.alive() for proc in cluster.procs)  # nobody was restarted
    except BaseException:
        print(cluster.logs(), cluster_group.logs(), sep="\n")
        raise
    finally:
        cluster.stop_all()
        cluster.services.store.close()
        broker.stop()
