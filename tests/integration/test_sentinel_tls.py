"""State and queues on a Redis Sentinel group over TLS (``rediss+sentinel://…?ssl_ca_certs=…``):
a primary, a replica and three sentinels that speak TLS only (sentinels, data ports and
replication), their certificate issued by a CA of the test's own.

The store's clients ask the sentinels over TLS, reach the primary over TLS and verify its
certificate, follow a planned failover, and a real api, worker and beat (the broker on
the same URL: kombu's sentinel transport over TLS) serve a send on it."""

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

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store import Store
from switchboard.shared.store.client import connect_async
from switchboard.supervisor.redis_sentinel import RedisSentinelGroup, redis_sentinel_missing
from switchboard.testing.procs import stop_groups, wait_healthy
from switchboard.testing.up import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def tls_group(tmp_path: Path) -> Iterator[RedisSentinelGroup]:
    missing = redis_sentinel_missing()
    if missing:
        pytest.skip(missing)
    tls = tls_files(tmp_path / "tls")
    skip_without_tls(tls, tmp_path / "probe")
    with RedisSentinelGroup(tmp_path / "group", replicas=1, tls=tls) as group:
        yield group


def test_the_store_reaches_the_primary_over_tls_and_follows_a_failover(
    tls_group: RedisSentinelGroup,
) -> None:
    """Scripts in a pipeline (the store's steps) run on the primary over TLS, for the sync
    client with the fast paths on and off and for the async client; after a planned
    ``SENTINEL FAILOVER`` every one of them writes on the promoted replica."""
    url = tls_group.url
    assert url.startswith("rediss+sentinel://") and "ssl_ca_certs=" in url
    stores = [Store.from_url(url, fast_paths=fast) for fast in (True, False)]
    async_client = connect_async(url, socket_timeout=5)
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
        with tls_group.primary.client() as primary:
            assert primary.exists(f"{stores[0].ks.session('agent:main:hook:tls0')}")

        new = tls_group.replicas[0]
        with tls_group.sentinels[0].client() as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", tls_group.master_name)
        deadline = time.monotonic() + 30
        while tls_group.named_primary() != {new.port}:
            assert time.monotonic() < deadline, "the sentinels never named the replica"
            time.sleep(0.1)

        writers = {f"store {n}": store.redis.set for n, store in enumerate(stores)}
        writers["async client"] = lambda key, value: loop.run_until_complete(
            async_client.set(key, value)
        )
        for name, write in writers.items():
            key = f"sb:moved:{name}"
            deadline = time.monotonic() + 20
            while True:  # a connection to the old primary is cut, then reconnects
                with contextlib.suppress(StoreUnavailable, redis.ConnectionError):
                    write(key, "after")
                with new.client() as promoted:
                    if promoted.get(key) == b"after":
                        break
                assert time.monotonic() < deadline, f"the {name} stayed behind"
                time.sleep(0.05)
    finally:
        for store in stores:
            store.close()
        loop.run_until_complete(async_client.aclose())
        loop.close()


def test_the_primarys_certificate_is_verified(tls_group: RedisSentinelGroup) -> None:
    """Without the CA that issued the nodes' certificate the store does not connect; with
    ``ssl_cert_reqs=none`` (verification off, the user's explicit choice) it does."""
    bare = tls_group.url.partition("?")[0]
    untrusting = Store.from_url(bare)
    try:
        with pytest.raises((StoreUnavailable, redis.ConnectionError)):
            untrusting.redis.set("sb:x", "1")
    finally:
        untrusting.close()
    unverified = Store.from_url(f"{bare}?ssl_cert_reqs=none")
    try:
        unverified.redis.set("sb:x", "1")
        assert unverified.redis.get("sb:x") in (b"1", "1")
    finally:
        unverified.close()


def test_api_worker_and_beat_serve_a_send_with_state_and_queues_on_tls_sentinel(
    tls_group: RedisSentinelGroup, switchboard_procs: Any
) -> None:
    """One URL for state and broker: the api publishes and the worker consumes through
    kombu's sentinel transport over TLS, and a send waits for its reply."""
    port = free_port()
    switchboard_procs.env["SWITCHBOARD_REDIS_URL"] = tls_group.url
    switchboard_procs.env.pop("SWITCHBOARD_BROKER_URL", None)
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
    with tls_group.primary.client() as primary:
        assert primary.exists("sb:s:agent:main:tls")  # the state is on the group's primary
        assert any(  # and so are Celery's queues (kombu's bindings)
            key.startswith(b"_kombu.binding.") for key in primary.scan_iter(count=1000)
        )
