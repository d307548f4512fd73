"""The store runs on redis-py's plain client (here with SWITCHBOARD_FAST_PATHS=off too),
and the product works the same on it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis

from switchboard.shared.config import Settings
from switchboard.shared.services import Services
from switchboard.shared.store.client import StoreRedis

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The integration settings with the fast paths off."""
    return settings.model_copy(update={"fast_paths": False})


def test_the_store_is_redis_pys_plain_client(services: Services) -> None:
    """The store's client is redis-py's own on a blocking pool."""
    client = services.store.redis
    assert type(client) is StoreRedis
    assert isinstance(client.connection_pool, redis.BlockingConnectionPool)


def test_a_send_and_wait_works_end_to_end(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """A run that sends into another session and waits for its reply completes on the plain
    client (Lua scripts, pipelines, the waiter's pub/sub), and its history reads back."""
    args = {"sessionKey": "hook:inner", "message": "/reply inner", "timeoutSeconds": 10}
    caller = rpc("agent", sessionKey="main", message="/tool sessions_send " + json.dumps(args))
    done = rpc("agent.wait", runId=caller["runId"], timeoutMs=20_000)
    assert done["status"] == "ok", done
    history = rpc("chat.history", sessionKey="hook:inner")
    assert "inner" in json.dumps(history)
    assert "agent:main:main" in {row["key"] for row in rpc("sessions.list")["sessions"]}
