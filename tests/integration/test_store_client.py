"""The store's edge: a Redis failure surfaces as `StoreUnavailable` (sync, async, and over
HTTP as the 503 the api always gave), and redis-py's own NOSCRIPT handling still works."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from fastapi.testclient import TestClient

from switchboard.api.app import create_app
from switchboard.shared.config import Settings, SwitchboardConfig
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store import Keyspace, Store
from switchboard.shared.store.aio import AsyncStore
from switchboard.shared.store.client import connect
from switchboard.shared.store.lua_scripts import LuaScripts
from switchboard.supervisor.redis_server import RedisServer
from switchboard.wiring import build_services
from switchboard.workers.app import create_celery_app
from switchboard.workers.queue import CeleryQueue

pytestmark = pytest.mark.integration


@pytest.fixture
def dead_url() -> str:
    """The URL of a loopback port nothing listens on (connections are refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


@pytest.fixture(params=[True, False], ids=["fast-paths", "plain"])
def dead_store(request: pytest.FixtureRequest, dead_url: str) -> Iterator[Store]:
    """A store whose Redis is down, on either client."""
    store = Store.from_url(dead_url, fast_paths=request.param)
    yield store
    store.close()


def test_a_store_command_against_a_down_redis_raises_store_unavailable(dead_store: Store) -> None:
    """A read, a pipeline and a ping all raise the store's error, from redis-py's."""
    for call in (
        lambda: dead_store.sessions.get("agent:main:main"),
        dead_store.counters.snapshot,
        dead_store.ping,
    ):
        with pytest.raises(StoreUnavailable) as raised:
            call()
        assert isinstance(raised.value.__cause__, redis.ConnectionError)
        assert raised.value.retry_after_s == 2


def test_best_effort_writes_swallow_an_outage(dead_store: Store) -> None:
    """A counter and an event are observations: with Redis down they are dropped quietly."""
    dead_store.counters.add("runs_started")
    assert dead_store.events.publish("run.started", {"runId": "r"}) is None


def test_the_async_store_against_a_down_redis_raises_store_unavailable(dead_url: str) -> None:
    """The api's async reads, a pipelined write and a run fetch raise the store's error."""

    async def attempts() -> list[BaseException | None]:
        store = AsyncStore.from_url(dead_url, Keyspace())
        calls = (
            store.ping(),
            store.events_end(),
            store.count_failure("203.0.113.9", 60),
            store.run_waiter().fetch("run-1"),
        )
        try:
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await store.aclose()
        return [o if isinstance(o, BaseException) else None for o in outcomes]

    for outcome in asyncio.run(attempts()):
        assert isinstance(outcome, StoreUnavailable), outcome
        assert isinstance(outcome.__cause__, redis.ConnectionError)


@pytest.mark.parametrize("fast_paths", [True, False], ids=["fast-paths", "plain"])
def test_a_script_flushed_from_redis_is_loaded_again(redis_url: str, fast_paths: bool) -> None:
    """NOSCRIPT is redis-py's cue to load a script, not an outage: it is not translated."""
    store = Store.from_url(redis_url, fast_paths=fast_paths)
    script = store.redis.register_script("return redis.call('INCR', KEYS[1])")
    try:
        assert script(keys=["noscript:n"]) == 1
        store.redis.script_flush()
        assert script(keys=["noscript:n"]) == 2
    finally:
        store.close()


def test_the_api_answers_503_with_retry_after_while_redis_is_down(
    dead_url: str, config: SwitchboardConfig
) -> None:
    """Readiness, a gateway call and an OpenAI call answer as before the store's edge
    existed: 503, ``Retry-After: 2`` and the unavailable message, never a 500."""
    settings = Settings(redis_url=dead_url, token="t")
    svc = build_services(settings, queue=CeleryQueue(create_celery_app(settings)), config=config)
    app = create_app(settings, config, services=svc)
    app.state.services = svc  # no lifespan: the waiter would wait for a Redis that is down
    http = TestClient(app, raise_server_exceptions=False)
    auth = {"Authorization": "Bearer t"}
    health = http.get("/healthz")
    rpc = http.post("/rpc", json={"method": "sessions.list", "params": {}}, headers=auth)
    for resp in (health, rpc):
        assert resp.status_code == 503, resp.text
        assert resp.headers["retry-after"] == "2"
        assert resp.json() == {
            "ok": False,
            "error": {"type": "unavailable", "message": "state store unavailable, retry shortly"},
        }
    chat = {"model": "switchboard/main", "messages": [{"role": "user", "content": "hi"}]}
    openai = http.post("/v1/chat/completions", json=chat, headers=auth)
    assert openai.status_code == 503, openai.text
    assert openai.headers["retry-after"] == "2"
    assert openai.json()["error"]["code"] == "unavailable"
    svc.store.close()


# ---- scripts in pipelines ------------------------------------------------------------------


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    """A Redis server of this test alone (it flushes the script cache and resets stats)."""
    with RedisServer(tmp_path, appendonly=False) as server:
        raw = redis.Redis.from_url(server.url)
        yield raw
        raw.close()


def _script_pipeline(client: redis.Redis, scripts: LuaScripts) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    pipe.set("sb-test:x", 1)
    scripts["spawn_cas"](record="sb-test:h", field="f", expected="", new="a", client=pipe)
    return cast(list[Any], pipe.execute())


def _script_checks(raw: redis.Redis) -> int:
    stats = raw.info("commandstats")
    return int(stats.get("cmdstat_script|exists", {}).get("calls", 0))


@pytest.mark.parametrize(("fast_paths", "checks"), [(True, 1), (False, 5)])
def test_pipelines_check_their_scripts_once_on_the_fast_path(
    own_redis: redis.Redis, fast_paths: bool, checks: int
) -> None:
    """redis-py asks `SCRIPT EXISTS` before every pipeline that runs a script; the fast-path
    client asks once and remembers, the plain one asks every time."""
    url = own_redis.connection_pool.connection_kwargs
    client = connect(f"redis://{url['host']}:{url['port']}/0", fast_paths=fast_paths)
    scripts = LuaScripts(client)
    own_redis.config_resetstat()
    for _ in range(5):
        assert _script_pipeline(client, scripts) == [True, 0]
    assert _script_checks(own_redis) == checks
    assert own_redis.info("commandstats")["cmdstat_evalsha"]["calls"] == 5


def test_a_flushed_script_cache_fails_one_pipeline_then_loads_again(own_redis: redis.Redis) -> None:
    """After `SCRIPT FLUSH` the fast path's first pipeline raises `StoreUnavailable` (a
    retried step), forgets what it knew, and the next one loads the script and runs."""
    url = own_redis.connection_pool.connection_kwargs
    client = connect(f"redis://{url['host']}:{url['port']}/0", fast_paths=True)
    scripts = LuaScripts(client)
    _script_pipeline(client, scripts)
    own_redis.script_flush()
    with pytest.raises(StoreUnavailable) as raised:
        _script_pipeline(client, scripts)
    assert isinstance(raised.value.__cause__, redis.exceptions.NoScriptError)
    assert _script_pipeline(client, scripts) == [True, 0]
    assert own_redis.hget("sb-test:h", "f") is None  # no hash: the script answered 0


def test_a_script_called_alone_is_still_loaded_by_redis_py(own_redis: redis.Redis) -> None:
    """Outside a pipeline nothing is taken as loaded: after `SCRIPT FLUSH`, redis-py's
    `Script` meets NOSCRIPT, loads the script and runs it again, on the fast path too."""
    url = own_redis.connection_pool.connection_kwargs
    client = connect(f"redis://{url['host']}:{url['port']}/0", fast_paths=True)
    scripts = LuaScripts(client)
    _script_pipeline(client, scripts)
    own_redis.script_flush()
    assert scripts["spawn_cas"](record="sb-test:h", field="f", expected="", new="a") == 0
    assert _script_pipeline(client, scripts) == [True, 0]  # known again: it was loaded
