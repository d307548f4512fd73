"""State on a Redis Cluster over TLS (``rediss+cluster://…?ssl_ca_certs=…``), as managed
clusters offer it: three private primaries with a replica each that speak TLS only (data
port, cluster bus and replication), their certificate issued by a CA of the test's own.

The store's clients reach the slot owner over TLS and verify its certificate, follow a
planned failover, and a real api, worker and beat serve a send on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tlskit import StoreClients, assert_certificate_verified, skip_without_tls, tls_files

from switchboard.shared.config import Settings
from switchboard.shared.store.keyspace import Keyspace
from switchboard_testkit.procs import send_and_wait
from switchboard_testkit.redis_cluster import RedisClusterGroup

pytestmark = pytest.mark.integration

# The one-slot store's prefix (SWITCHBOARD_SLOT_GROUPS=1), whose one slot owner is followed.
PREFIX = Settings(redis_url="rediss+cluster://h:1", slot_groups=1).key_prefix


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
    client and for the async client; after a planned
    ``CLUSTER FAILOVER`` every one of them writes on the new owner."""
    url = tls_cluster.url
    assert url.startswith("rediss+cluster://")
    with StoreClients(url, PREFIX) as clients:
        written = clients.run_scripts()
        with tls_cluster.primary_for(PREFIX).client() as owner:
            assert owner.exists(*written) == len(written)

        old = tls_cluster.primary_for(PREFIX)
        new = tls_cluster.planned_failover(old, PREFIX)
        clients.all_write_on(new, PREFIX)


def test_the_owners_certificate_is_verified(tls_cluster: RedisClusterGroup) -> None:
    """Without the CA that issued the nodes' certificate the store does not connect; with
    ``ssl_cert_reqs=none`` (verification off, the user's explicit choice) it does."""
    assert_certificate_verified(tls_cluster.url, PREFIX)


def test_api_worker_and_beat_serve_a_send_with_the_state_on_a_tls_cluster(
    tls_cluster: RedisClusterGroup, redis_url: str, switchboard_procs: Any
) -> None:
    """The broker apart (a plain Redis: kombu has no cluster transport), the state on the
    TLS cluster: a send waits for its reply through a real api and worker."""
    switchboard_procs.env["SWITCHBOARD_REDIS_URL"] = tls_cluster.url
    switchboard_procs.env["SWITCHBOARD_BROKER_URL"] = redis_url
    with switchboard_procs.serving() as (url, _):
        result = send_and_wait(url, "agent:main:tls", "over tls")
        assert result["status"] == "ok" and result["reply"] == "over tls", result
    settings = Settings(redis_url=tls_cluster.url)  # its slot groups spread the state
    session = Keyspace(settings.key_prefix, settings.groups).session("agent:main:tls")
    with tls_cluster.primary_for(session).client() as owner:
        assert owner.exists(session)  # the state is on the cluster, on its slot's owner
