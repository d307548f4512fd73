"""State on a Redis Cluster over TLS (``rediss+cluster://…?ssl_ca_certs=…``), as managed
clusters offer it: three private primaries with a replica each that speak TLS only (data
port, cluster bus and replication), their certificate issued by a CA of the test's own.

The store's clients reach the slot owner over TLS and verify its certificate, follow a
planned failover, and a real api, worker and beat serve a send on it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from tlskit import skip_without_tls, tls_files

from switchboard.shared.config import Settings
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store import Store
from switchboard.shared.store.client import connect_async
from switchboard.supervisor.redis_cluster import RedisClusterGroup
from switchboard.testing.procs import stop_groups, wait_healthy
from switchboard.testing.up import free_port

pytestmark = pytest.mark.integration

PREFIX = Settings(redis_url="rediss+cluster://h:1").key_prefix


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[RedisClusterGroup]:
    tls = tls_files(tmp_path / "tls")
    skip_without_tls(tls, tmp_path / "probe")
    with RedisClusterGroup(tmp_path / "cluster", replicas_per_primary=1, tls=tls) as group:
        yield group


def test_the_store_reaches_the_owner_over_tls_and_follows_a_failover(
    tls_cluster: RedisClusterGroup,
) -> None:
    """Scripts in a pipeline (the store's steps) run on the owner over TLS, for the sync
    client with the fast paths on and off and for the async client; after a planned
    ``CLUSTER FAILOVER`` every one of them writes on the new owner."""
    url = tls_cluster.url
    assert url.startswith("rediss+cluster://")
    stores = [Store.from_url(url, fast_paths=fast, prefix=PREFIX) for fast in (True, False)]
    async_client = connect_async(url, prefix=PREFIX, socket_timeout=5)
    loop = asyncio.new_event_loop()
    try:
        for n, store in enumerate(stores):
            key = f"agent:main:hook:tls{n}"
            _, created = store.sessions.ensure(key)
            assert created
            store.transcripts.append(key, {"role": "user", "content": "hi"}, now_ms=1)
            pipe = store.pipeline()  # scripts in a pipeline, on one connection
            store.sessions.touch(key, client=pipe)
            pipe.execute()
            assert [m["content"] for m in store.transcripts.all(key)] == ["hi"]
        assert loop.run_until_complete(async_client.ping())

        old = tls_cluster.primary_for(PREFIX)
        new = tls_cluster.replica_of(old)
        with new.client() as replica:
            replica.execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + 20
        while tls_cluster.primary_for(PREFIX) is not new:
            assert time.monotonic() < deadline, "the replica never took the slot"
            time.sleep(0.1)

        writers = {f"store {n}": store.redis.set for n, store in enumerate(stores)}
        writers["async client"] = lambda key, value: loop.run_until_complete(
            async_client.set(key, value)
        )
        for name, write in writers.items():
            key = f"{PREFIX}moved:{name}"
            deadline = time.monotonic() + 10
            while True:  # a moved connection fails once, then reconnects to the new owner
                with contextlib.suppress(StoreUnavailable, redis.ConnectionError):
                    write(key, "after")
                with new.client() as owner:
                    if owner.get(key) == b"after":
                        break
                assert time.monotonic() < deadline, f"the {name} stayed behind"
                time.sleep(0.05)
    finally:
        for store in stores:
            store.close()
        loop.run_until_complete(async_client.aclose())
        loop.close()


def test_the_owners_certificate_is_verified(tls_cluster: RedisClusterGroup) -> None:
    """Without the CA that issued the nodes' certificate the store does not connect; with
    ``ssl_cert_reqs=none`` (verification off, the user's explicit choice) it does."""
    bare = tls_cluster.url.partition("?")[0]
    untrusting = Store.from_url(bare, prefix=PREFIX)
    try:
        with pytest.raises((StoreUnavailable, redis.ConnectionError)):
            untrusting.redis.set(f"{PREFIX}x", "1")
    finally:
        untrusting.close()
    unverified = Store.from_url(f"{bare}?ssl_cert_reqs=none", prefix=PREFIX)
    try:
        unverified.redis.set(f"{PREFIX}x", "1")
        assert unverified.redis.get(f"{PREFIX}x") in (b"1", "1")
    finally:
        unverified.close()


def test_api_worker_and_beat_serve_a_send_with_the_state_on_a_tls_cluster(
    tls_cluster: RedisClusterGroup, redis_url: str, switchboard_procs: Any
) -> None:
    """The broker apart (a plain Redis: kombu has no cluster transport), the state on the
    TLS cluster: a send waits for its reply through a real api and worker."""
    port = free_port()
    switchboard_procs.env["SWITCHBOARD_REDIS_URL"] = tls_cluster.url
    switchboard_procs.env["SWITCHBOARD_BROKER_URL"] = redis_url
    procs = [
        switchboard_procs("api", "--port", str(port)),
        switchboard_procs("worker", "--concurrency", "2"),
        switchboard_procs("beat"),
    ]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, procs)
        args = {"sessionKey": "agent:main:tls", "message": "over tls", "timeoutSeconds": 30}
        with httpx.Client(base_url=url, headers={"Authorization": "Bearer t"}, timeout=40) as http:
            resp = http.post("/tools/invoke", json={"tool": "sessions_send", "args": args})
        assert resp.status_code == 200, resp.text
        result = resp.json()["result"]
        assert result["status"] == "ok", result
        assert result["reply"] == "over tls"
    finally:
        stop_groups(procs, timeout_s=15)
    owner = tls_cluster.primary_for(PREFIX)
    with owner.client() as client:
        assert client.exists(f"{PREFIX}s:agent:main:tls")  # the state is on the cluster
