"""The private Redis Cluster the tests and the benchmark run on: three primaries with a
replica each, real redis-server processes on free loopback ports. Keys spread over the
primaries; a primary killed with SIGKILL is replaced by its replica, which then serves its
slots; stopping the group leaves none of its processes behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from switchboard.shared.errors import Unavailable
from switchboard.supervisor.redis_server import find_redis_server
from switchboard_testkit.redis_cluster import RedisClusterGroup

pytestmark = pytest.mark.integration

# Hash tags chosen to fall in different thirds of the slot space ({a}: 15495, {b}: 3300,
# {c}: 7365, {sb}: 4590), so an even split puts them on different primaries.
TAGGED_KEYS = ["{a}:k", "{b}:k", "{c}:k", "{sb}:k"]


def _redis_server_running(pid: int) -> bool:
    """True while ``pid`` is a live redis-server (a reused pid of another program is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the signal probe
    return b"redis-server" in cmdline


def test_cluster_spreads_keys_fails_over_and_stops_clean(tmp_path: Path) -> None:
    try:
        find_redis_server()
    except Unavailable as exc:
        pytest.skip(f"no redis-server to run a Redis Cluster: {exc}")
    group = RedisClusterGroup(
        tmp_path / "cluster", primaries=3, replicas_per_primary=1, node_timeout_ms=1000
    )
    group.start()
    pids: list[int] = []
    try:
        assert len(group.nodes) == 6
        pids = group.pids
        assert len(pids) == 6
        assert group.ready()
        primaries = group.nodes[:3]
        assert group.url == "redis+cluster://" + ",".join(
            f"127.0.0.1:{node.port}" for node in primaries
        )

        client = group.client()
        try:
            for key in TAGGED_KEYS:
                assert client.set(key, f"value of {key}")
            assert client.set("{sb}:before", "kept")
        finally:
            client.close()
        owners = {key: group.primary_for(key) for key in TAGGED_KEYS}
        assert len({node.port for node in owners.values()}) >= 2, owners
        for key, node in owners.items():
            assert node in primaries
            with node.client() as direct:  # the key is stored on the node named for it
                assert direct.get(key) == f"value of {key}".encode()

        old = group.primary_for("{sb}:x")
        replica = group.replica_of(old)
        assert replica is not old and replica not in primaries
        with old.client() as direct:  # the replica has what was written before the kill
            assert direct.execute_command("WAIT", 1, 10_000) >= 1
        old_pid = old.pid
        assert old_pid is not None
        group.kill(old)
        assert old.pid is None
        assert not _redis_server_running(old_pid)

        promoted = group.wait_promoted(old, timeout_s=30)
        assert promoted is replica
        assert group.primary_for("{sb}:x") is replica

        fresh = group.client()
        try:
            assert fresh.set("{sb}:x", "after failover")
            assert fresh.get("{sb}:x") == b"after failover"
            assert fresh.get("{sb}:before") == b"kept"
        finally:
            fresh.close()
        with replica.client() as direct:
            assert direct.get("{sb}:x") == b"after failover"
    finally:
        group.stop()
    assert group.nodes == []
    assert [pid for pid in pids if _redis_server_running(pid)] == []
