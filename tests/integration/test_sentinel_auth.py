"""Sentinels that require a password of their own (``requirepass`` in their configuration,
as Helm charts and hardened installs set it): the URL gives it as
``?sentinel_password=…``; the store and the Celery broker ask the sentinels with it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from switchboard.shared.config import Settings
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store import Store
from switchboard.shared.store.keyspace import Keyspace
from switchboard_testkit.procs import send_and_wait
from switchboard_testkit.redis_sentinel import RedisSentinelGroup, redis_sentinel_missing

pytestmark = pytest.mark.integration

PASSWORD = "s3ntinel&pw"  # a character that must be quoted in the URL's query


@pytest.fixture
def guarded_group(tmp_path: Path) -> Iterator[RedisSentinelGroup]:
    missing = redis_sentinel_missing()
    if missing:
        pytest.skip(missing)
    with RedisSentinelGroup(tmp_path / "group", replicas=1, sentinel_password=PASSWORD) as group:
        yield group


def test_the_store_asks_password_protected_sentinels_with_the_urls_password(
    guarded_group: RedisSentinelGroup,
) -> None:
    with guarded_group.sentinels[0].client() as sentinel:  # the harness's own check
        assert sentinel.ping()
    bare = redis.Redis(port=guarded_group.sentinels[0].port, socket_timeout=2)
    with bare, pytest.raises(redis.AuthenticationError):
        bare.sentinel_masters()  # the sentinels really require it

    url = guarded_group.url
    assert "sentinel_password=s3ntinel%26pw" in url
    store = Store.from_url(url)
    try:
        store.redis.set("sb:guarded", "1")
        with guarded_group.primary.client() as primary:
            assert primary.get("sb:guarded") == b"1"
    finally:
        store.close()

    without = Store.from_url(url.partition("?")[0])
    try:
        with pytest.raises(StoreUnavailable):
            without.redis.set("sb:guarded", "2")
    finally:
        without.close()


def test_api_worker_and_beat_serve_a_send_through_password_protected_sentinels(
    guarded_group: RedisSentinelGroup, switchboard_procs: Any
) -> None:
    """State and queues on the group: kombu's sentinel transport asks the sentinels with
    the password too (its ``sentinel_kwargs``)."""
    switchboard_procs.env["SWITCHBOARD_REDIS_URL"] = guarded_group.url
    switchboard_procs.env.pop("SWITCHBOARD_BROKER_URL", None)
    with switchboard_procs.serving() as (url, _):
        result = send_and_wait(url, "agent:main:guarded", "past the sentinels")
        assert result["status"] == "ok" and result["reply"] == "past the sentinels", result
    with guarded_group.primary.client() as primary:
        assert primary.exists(Keyspace("sb:", Settings().groups).session("agent:main:guarded"))
