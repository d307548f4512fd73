"""The product's Redis clients open connections without reading package metadata, and
still tell the server which client library and version they are."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
import redis.utils

from switchboard.api.auth import AuthGate
from switchboard.shared.store.client import connect
from switchboard.shared.store.keyspace import Keyspace

pytestmark = pytest.mark.integration


@pytest.fixture
def no_metadata_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every read of redis-py's version from the installed package's metadata by
    the test's own thread (not by another store's follower thread, connecting meanwhile)."""
    reads: list[str] = []
    this_thread = threading.current_thread()

    def read() -> str:
        if threading.current_thread() is this_thread:
            reads.append("get_lib_version")
        return redis.__version__

    monkeypatch.setattr(redis.utils, "get_lib_version", read)
    return reads


def test_the_store_pool_opens_many_connections_without_metadata_reads(
    redis_url: str, no_metadata_reads: list[str]
) -> None:
    """Forty connections taken at once (a burst filling the pool) read no metadata, and
    each still carries redis-py's version (what CLIENT SETINFO tells a Redis 7.2+)."""
    client = connect(redis_url)
    pool = client.connection_pool
    conns = [pool.get_connection() for _ in range(40)]
    try:
        assert len({id(c) for c in conns}) == 40
        assert client.ping()
        assert {c.driver_info.lib_version for c in conns} == {redis.__version__}
    finally:
        for conn in conns:
            pool.release(conn)
        client.close()
    assert no_metadata_reads == []


def test_the_api_lockout_client_connects_without_metadata_reads(
    redis_url: str, no_metadata_reads: list[str]
) -> None:
    """The api's async client (the auth gate's lockout count) too."""

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("not called")

    gate = AuthGate(
        app,
        token="t",
        public_paths=(),
        redis_url=redis_url,
        keyspace=Keyspace(),
        max_failures=5,
        window_s=60,
    )

    async def lockout_reads() -> int | None:
        try:
            return await gate._record_failure("203.0.113.9")
        finally:
            client = gate._client()
            assert client is not None
            await client.aclose()

    assert asyncio.run(lockout_reads()) is None
    assert no_metadata_reads == []
