"""State and queues on a Redis Sentinel group over TLS (``rediss+sentinel://…?ssl_ca_certs=…``):
a primary, a replica and three sentinels that speak TLS only (sentinels, data ports and
replication), their certificate issued by a CA of the test's own.

The store's clients ask the sentinels over TLS, reach the primary over TLS and verify its
certificate, follow a planned failover, and a real api, worker and beat (the broker on
the same URL: kombu's sentinel transport over TLS) serve a send on it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tlskit import StoreClients, assert_certificate_verified, skip_without_tls, tls_files

from switchboard.shared.config import Settings
from switchboard.shared.store.keyspace import Keyspace
from switchboard_testkit.procs import send_and_wait
from switchboard_testkit.redis_sentinel import RedisSentinelGroup, redis_sentinel_missing

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
    client and for the async client; after a planned
    ``SENTINEL FAILOVER`` every one of them writes on the promoted replica."""
    url = tls_group.url
    assert url.startswith("rediss+sentinel://") and "ssl_ca_certs=" in url
    with StoreClients(url) as clients:
        written = clients.run_scripts()
        with tls_group.primary.client() as primary:
            assert primary.exists(*written) == len(written)

        new = tls_group.replicas[0]
        with tls_group.sentinels[0].client() as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", tls_group.master_name)
        deadline = time.monotonic() + 30
        while tls_group.named_primary() != {new.port}:
            assert time.monotonic() < deadline, "the sentinels never named the replica"
            time.sleep(0.1)
        clients.all_write_on(new, "sb:")


def test_the_primarys_certificate_is_verified(tls_group: RedisSentinelGroup) -> None:
    """Without the CA that issued the nodes' certificate the store does not connect; with
    ``ssl_cert_reqs=none`` (verification off, the user's explicit choice) it does."""
    assert_certificate_verified(tls_group.url)


def test_api_worker_and_beat_serve_a_send_with_state_and_queues_on_tls_sentinel(
    tls_group: RedisSentinelGroup, switchboard_procs: Any
) -> None:
    """One URL for state and broker: the api publishes and the worker consumes through
    kombu's sentinel transport over TLS, and a send waits for its reply."""
    switchboard_procs.env["SWITCHBOARD_REDIS_URL"] = tls_group.url
    switchboard_procs.env.pop("SWITCHBOARD_BROKER_URL", None)
    with switchboard_procs.serving() as (url, _):
        result = send_and_wait(url, "agent:main:tls", "over tls")
        assert result["status"] == "ok" and result["reply"] == "over tls", result
    with tls_group.primary.client() as primary:
        assert primary.exists(
            Keyspace("sb:", Settings().groups).session("agent:main:tls")
        )  # the state is on the group's primary
        assert any(  # and so are Celery's queues (kombu's bindings)
            key.startswith(b"_kombu.binding.") for key in primary.scan_iter(count=1000)
        )
