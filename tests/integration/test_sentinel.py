"""State and broker on a Redis Sentinel group (``redis+sentinel://``): a private primary,
one replica and three sentinels, each a real redis-server on a port of its own.

The store, the CLI and a worker reach the primary through the sentinel URL; then the
primary is killed (kill -9) under load, and without restarting the api, the worker or the
beat: every run acknowledged before ends ok exactly once with exact transcripts, new sends
complete on the promoted replica, and the api answers 200 or 503 with Retry-After while
the sentinels fail over, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from switchboard.shared.config import Settings
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store import Store
from switchboard.shared.store.client import connect_async, connect_plain
from switchboard.shared.store.keyspace import Keyspace
from switchboard.supervisor.runfile import RUNFILE
from switchboard_testkit.redis_sentinel import RedisSentinelGroup
from switchboard_testkit.webhook_receiver import WebhookReceiver

# The fault tests' kit (its processes and checks) lives beside their conftest.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from faultkit import (
    TOKEN,
    Cluster,
    FailoverProber,
    api_post,
    api_send,
    assert_failover_lost_nothing,
    base_config,
    count_by,
    free_port,
    redis_sentinel_group,
    wait_until,
)


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[RedisSentinelGroup]:
    """A group of the test's own (the failover tests change which node is the primary)."""
    with redis_sentinel_group(tmp_path / "group") as group:
        yield group


@pytest.fixture(scope="module")
def steady_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelGroup]:
    """A group the module's tests that fail nothing over share."""
    with redis_sentinel_group(tmp_path_factory.mktemp("sentinel-group")) as group:
        yield group


@pytest.mark.integration
def test_store_round_trips_through_the_sentinel_url(steady_group: RedisSentinelGroup) -> None:
    """The store's sync client, its probe client and its async client all reach the
    primary the sentinels name, and read their own writes."""
    store = Store.from_url(steady_group.url)
    try:
        store.ping()
        run = store.redis.pipeline()
        run.set("sentinel:probe", "written")
        run.incr("sentinel:count:")
        assert run.execute() == [True, 1]
        with steady_group.primary.client() as primary:
            assert primary.get("sentinel:probe") == b"written"
        probe = connect_plain(steady_group.url, socket_timeout=3)
        assert probe.get("sentinel:probe") == b"written"
        probe.close()

        async def read_async() -> Any:
            client = connect_async(steady_group.url, socket_timeout=3)
            try:
                return await client.get("sentinel:probe")
            finally:
                await client.aclose()

        assert asyncio.run(read_async()) == b"written"
    finally:
        store.close()


@pytest.mark.integration
def test_planned_failover_moves_every_connection_to_the_new_primary(
    sentinel_group: RedisSentinelGroup,
) -> None:
    """SENTINEL FAILOVER leaves the old primary up and writable until Sentinel reconfigures
    it (about ten seconds later; what was written there is then thrown away). The store's
    connections, a thread's held one included, move to the new primary within a second or
    two of the sentinels naming it."""
    store = Store.from_url(sentinel_group.url)
    try:
        store.redis.set("sentinel:where", "before")
        with sentinel_group.sentinels[0].client() as sentinel:
            assert sentinel.sentinel_failover(sentinel_group.master_name)
        wait_until(
            lambda: sentinel_group.named_primary() == {sentinel_group.replicas[0].port},
            15,
            "every sentinel to name the replica as the primary",
            0.1,
        )
        named_at = time.monotonic()

        def written_on_new_primary() -> bool:
            with contextlib.suppress(StoreUnavailable):  # a cut connection fails once
                store.redis.set("sentinel:where", "after")
            with sentinel_group.replicas[0].client() as promoted:
                return promoted.get("sentinel:where") == b"after"

        wait_until(written_on_new_primary, 5, "a write to reach the new primary", 0.05)
        print(f"\nwrites on the new primary {time.monotonic() - named_at:.2f}s after the switch")
        for n in range(20):  # every later write goes there, none to the old primary
            store.redis.set("sentinel:where", f"final {n}")
        with sentinel_group.replicas[0].client() as promoted:
            assert promoted.get("sentinel:where") == b"final 19"
        with sentinel_group.primary.client() as old:
            assert old.info("replication")["role"] == "master"  # not yet reconfigured
            assert not (old.get("sentinel:where") or b"").startswith(b"final")
    finally:
        store.close()


@pytest.mark.integration
def test_planned_failover_moves_the_async_client_and_its_subscriptions(
    sentinel_group: RedisSentinelGroup,
) -> None:
    """The api's async client (run reads, the run-end subscription) follows a planned
    failover too: a subscriber on the old primary would hear nothing published on the new
    one until Sentinel reconfigured the old primary."""

    async def heard(subscriber: Any) -> bool:
        """Whether the subscriber got "hello"; False after a cut (it resubscribes)."""
        try:
            found = await subscriber.get_message(ignore_subscribe_messages=True, timeout=0.2)
        except redis.ConnectionError:
            await subscriber.aclose()  # as the api's waiter does: subscribe again
            await subscriber.subscribe("sentinel:events")
            return False
        return found is not None and found["data"] == b"hello"

    async def scenario() -> float:
        client = connect_async(sentinel_group.url, socket_timeout=5)
        try:
            async with client.pubsub() as subscriber:
                await subscriber.subscribe("sentinel:events")
                assert (await subscriber.get_message(timeout=2))["type"] == "subscribe"
                # A pooled connection of its own, idle in the pool through the failover.
                await client.set("sentinel:async", "before")
                with sentinel_group.sentinels[0].client() as sentinel:
                    assert sentinel.sentinel_failover(sentinel_group.master_name)
                deadline = time.monotonic() + 15
                while sentinel_group.named_primary() != {sentinel_group.replicas[0].port}:
                    assert time.monotonic() < deadline, "no sentinel named the replica"
                    await asyncio.sleep(0.1)
                named_at = time.monotonic()
                while True:  # the idle connection's writes reach the new primary
                    assert time.monotonic() - named_at < 5, "the async client stayed behind"
                    with contextlib.suppress(StoreUnavailable):
                        await client.set("sentinel:async", "after")
                    with sentinel_group.replicas[0].client() as promoted:
                        if promoted.get("sentinel:async") == b"after":
                            break
                    await asyncio.sleep(0.05)
                moved_s = time.monotonic() - named_at
                while True:  # the subscription hears what the new primary publishes
                    assert time.monotonic() - named_at < 5, "the subscriber stayed behind"
                    with sentinel_group.replicas[0].client() as promoted:
                        promoted.publish("sentinel:events", "hello")
                    if await heard(subscriber):
                        break
            return moved_s
        finally:
            await client.aclose()

    moved_s = asyncio.run(scenario())
    print(f"\nthe async client wrote on the new primary {moved_s:.2f}s after the switch")


@pytest.mark.integration
def test_cli_check_health_and_bad_urls(steady_group: RedisSentinelGroup, tmp_path: Path) -> None:
    """check-health pings the primary through the sentinels; a cluster URL without a broker
    of its own is one line and exit 2 at start, not a traceback."""
    env = {**os.environ, "SWITCHBOARD_DATA_DIR": str(tmp_path / "data")}

    def switchboard(url: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "switchboard", *args],
            env={**env, "SWITCHBOARD_REDIS_URL": url, "SWITCHBOARD_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            timeout=60,
        )

    healthy = switchboard(steady_group.url, "check-health")
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.strip() == "healthy"

    cluster = switchboard("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", "api", "--port", "0")
    assert cluster.returncode == 2
    lines = cluster.stderr.strip().splitlines()
    assert len(lines) == 1, cluster.stderr
    assert lines[0].startswith("error: SWITCHBOARD_REDIS_URL is a Redis Cluster, which holds ")
    assert "set SWITCHBOARD_BROKER_URL" in lines[0]

    unknown_master = steady_group.url.replace(f"/{steady_group.master_name}/", "/nosuchgroup/")
    down = switchboard(unknown_master, "check-health")
    assert down.returncode == 3
    assert "nosuchgroup" in down.stderr and "Traceback" not in down.stderr


@pytest.mark.integration
def test_up_runs_on_the_sentinel_group_instead_of_embedding_redis(
    steady_group: RedisSentinelGroup, tmp_path: Path
) -> None:
    """`switchboard up` with a sentinel URL starts no redis-server of its own: its api,
    worker and beat use the group, and a run completes through it."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")},
        "SWITCHBOARD_REDIS_URL": steady_group.url,
        "SWITCHBOARD_TOKEN": TOKEN,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "up", "--port", str(port), "--concurrency", "4"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert proc.poll() is None, "up exited"
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, "up's api to answer /healthz", 0.2)
        run_id = api_send(url, "up-sentinel", "through the group")
        wait = {"method": "agent.wait", "params": {"runId": run_id, "timeoutMs": 30_000}}
        resp, _ = api_post(url, "/rpc", wait)
        assert resp.status_code == 200 and resp.json()["status"] == "ok", resp.text
        health = subprocess.run(
            [sys.executable, "-m", "switchboard", "check-health", "--api", "--worker"],
            cwd=tmp_path,
            env={**env, "SWITCHBOARD_PORT": str(port)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert health.returncode == 0, health.stderr  # the worker answers over the group
        info = json.loads((tmp_path / ".switchboard" / RUNFILE).read_text())
        assert info["redis_url"] == steady_group.url
        assert not (tmp_path / ".switchboard" / "redis").exists()  # nothing embedded
        with steady_group.primary.client() as primary:
            assert primary.exists(Keyspace("sb:", Settings().groups).run(run_id))
    finally:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.faults
def test_failover_under_load_loses_nothing_and_needs_no_restart(
    sentinel_group: RedisSentinelGroup, tmp_path: Path, webhook: WebhookReceiver
) -> None:
    """kill -9 of the primary with runs in flight: the sentinels promote the replica, the
    worker, beat and api follow it by themselves, and every acknowledged run ends ok."""
    cluster = Cluster(sentinel_group.url, tmp_path, base_config(webhook.url))
    try:
        _run_failover(cluster, sentinel_group)
    except BaseException:
        print(cluster.logs(), sentinel_group.logs(), sep="\n")
        raise
    finally:
        cluster.stop_all()
        cluster.services.store.close()


def _run_failover(cluster: Cluster, group: RedisSentinelGroup) -> None:
    worker = cluster.worker(concurrency=16)
    beat = cluster.beat()
    api, url = cluster.api()

    # Broker and state on the sentinel URL: a run completes end to end before the fault.
    first = api_send(url, "before-0", "hello")
    resp, _ = api_post(
        url, "/rpc", {"method": "agent.wait", "params": {"runId": first, "timeoutMs": 30_000}}
    )
    assert resp.status_code == 200 and resp.json()["status"] == "ok", resp.text

    acknowledged = [first]
    for i in range(12):
        for j in range(2):
            acknowledged.append(api_send(url, f"load-{i}", f"/sleep 1\nrun {i}.{j}"))
    # Everything acknowledged so far is on the replica before the primary dies: a write
    # then WAIT (loopback replication is sub-millisecond; this makes it certain).
    with group.primary.client() as primary:
        primary.set("sentinel:fence", "1")
        assert primary.wait(1, 2000) == 1
    at_kill = count_by(r.status for r in cluster.runs())
    print(f"\nacknowledged {len(acknowledged)}; at the kill: {at_kill}")

    with FailoverProber(url) as prober:
        assert group.primary.pid is not None
        os.kill(group.primary.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_until(
            lambda: group.named_primary() == {group.replicas[0].port},
            30,
            "every sentinel to name the replica as the primary",
            0.2,
        )
        promoted_s = time.monotonic() - killed_at
        # Keep probing until the api answers a send again through the new primary.
        prober.acknowledged_again()
    during = count_by((a[0], a[1]) for a in prober.answers)
    print(f"promoted after {promoted_s:.1f}s; answers during: {during}")

    assert_failover_lost_nothing(cluster, url, acknowledged, prober)

    # Nobody was restarted: the same processes served before and after.
    assert worker.alive() and beat.alive() and api.alive()
    with redis.Redis(port=group.replicas[0].port) as promoted:
        assert promoted.info("replication")["role"] == "master"
