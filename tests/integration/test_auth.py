"""Every route but the public ones needs the token; repeated failures lock a client out.

The routes are enumerated from the app itself (`app.routes`, included routers and mounts),
so a route added later is covered without editing this file. Public are `/healthz` and the
console's page shell, which must carry no data.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis
import uvicorn
from fastapi import FastAPI
from starlette.routing import Mount, Route, WebSocketRoute

from switchboard.api.app import create_app
from switchboard.shared.config import Settings, SwitchboardConfig
from switchboard.shared.services import Services
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.tools.catalog import ALL_TOOLS

pytestmark = pytest.mark.integration

TOKEN = "auth-test-token-0123456789"
SECRET_PROBE = "agent:main:secretprobe"  # a session key no public answer may show
_PATH_PARAM = re.compile(r"\{[^}]+\}")


def _settings(redis_url: str, tmp_path: Any, **overrides: Any) -> Settings:
    return Settings(redis_url=redis_url, token=TOKEN, data_dir=tmp_path / "data", **overrides)


@contextlib.contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port (all of 127.0.0.0/8 reaches it)."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "api did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def client_from(source_ip: str, base_url: str, token: str | None = None) -> httpx.Client:
    """A client whose requests come from ``source_ip`` (a loopback address)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.HTTPTransport(local_address=source_ip)
    return httpx.Client(base_url=base_url, transport=transport, headers=headers, timeout=30)


def http_routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) the app answers, included routers and mounts too."""
    found: set[tuple[str, str]] = set()

    def add(path: str, methods: set[str] | None) -> None:
        concrete = _PATH_PARAM.sub("probe", path)
        for method in methods or {"GET", "POST"}:
            if method != "HEAD":
                found.add((method, concrete))

    for route in app.routes:
        if hasattr(route, "effective_route_contexts"):  # FastAPI's included routers
            for ctx in route.effective_route_contexts():
                add(ctx.path, ctx.methods)
        elif isinstance(route, Mount):
            add(route.path.rstrip("/") + "/", None)
        elif isinstance(route, Route):
            add(route.path, route.methods)
        elif isinstance(route, WebSocketRoute):
            raise AssertionError(f"websocket route {route.path}: extend this test")
    return sorted(found)


@pytest.fixture
def open_app(redis_url: str, tmp_path: Any, config: SwitchboardConfig, services: Services) -> Any:
    """The full api with a lockout limit high enough for probing every route."""
    app = create_app(_settings(redis_url, tmp_path, auth_max_failures=10_000), config, services)
    with serve(app) as url:
        yield app, url


@pytest.fixture
def locking_app(
    redis_url: str, tmp_path: Any, config: SwitchboardConfig, services: Services
) -> Callable[[], Any]:
    """Start apis (sharing the private Redis) that lock a client out after 3 failures in 60 s."""
    stack = contextlib.ExitStack()
    settings = _settings(redis_url, tmp_path, auth_max_failures=3, auth_failure_window_s=60)

    def start() -> str:
        return stack.enter_context(serve(create_app(settings, config, services)))

    with stack:
        yield start


def test_every_route_but_the_public_ones_requires_the_token(
    open_app: tuple[FastAPI, str], services: Services
) -> None:
    """No token or a wrong token → 401 on every route; public answers carry no data."""
    app, url = open_app
    services.store.sessions.ensure(SECRET_PROBE, on_create={"label": "secretprobe"})
    routes = http_routes(app)
    paths = {path for _, path in routes}
    assert {"/rpc", "/tools/invoke", "/openapi.json", "/healthz"} <= paths, paths
    public = set(app.state.public_paths)
    assert "/healthz" in public
    checked = 0
    with httpx.Client(base_url=url, timeout=30) as anon:
        for method, path in [*routes, ("GET", "/no/such/route"), ("POST", "/rpc/")]:
            if path in public:
                continue
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                resp = anon.request(method, path, headers=headers, content=b"{}")
                assert resp.status_code == 401, (method, path, resp.status_code, resp.text)
                # /v1/* answers in OpenAI's error shape; every answer names no data.
                assert "error" in resp.json(), (path, resp.text)
                assert "secretprobe" not in resp.text
                checked += 1
        assert anon.get("/healthz").status_code == 200
        for path in sorted(public - {"/healthz"}):
            resp = anon.get(path, follow_redirects=False)
            assert resp.status_code < 400, (path, resp.status_code)
            media = resp.headers.get("content-type", "")
            assert not media.startswith(("application/json", "text/event-stream")), (path, media)
            assert "secretprobe" not in resp.text, path
    assert checked >= 3 * 8


def test_openapi_document_needs_the_token_and_describes_the_bodies(
    open_app: tuple[FastAPI, str],
) -> None:
    """`/openapi.json` is served with the token and declares the /rpc and /tools bodies."""
    _, url = open_app
    assert httpx.get(f"{url}/openapi.json").status_code == 401
    doc = httpx.get(f"{url}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    rpc = doc["paths"]["/rpc"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert rpc["discriminator"] == {"propertyName": "method"}
    by_method = {v["properties"]["method"]["const"]: v for v in rpc["oneOf"]}
    assert {"agent", "agent.wait", "chat.send", "sessions.list", "sessions.patch"} <= set(by_method)
    agent_params = by_method["agent"]["properties"]["params"]
    assert agent_params["required"] == ["message"]
    assert "$ref" not in str(rpc)
    tools = doc["paths"]["/tools/invoke"]["post"]["requestBody"]["content"]["application/json"]
    by_tool = {v["properties"]["tool"]["const"]: v for v in tools["schema"]["oneOf"]}
    assert set(by_tool) == {spec.name for spec in ALL_TOOLS}
    for spec in ALL_TOOLS:
        assert by_tool[spec.name]["properties"]["args"] == spec.parameters


def test_repeated_failures_lock_the_client_out_with_retry_after(
    locking_app: Callable[[], str], redis_url: str
) -> None:
    """After 3 failures: 429 + Retry-After even with the right token; /healthz still answers."""
    url = locking_app()
    with client_from("127.0.0.2", url) as attacker:
        for _ in range(3):
            assert (
                attacker.post("/rpc", headers={"Authorization": "Bearer guess"}).status_code == 401
            )
        locked = attacker.post("/rpc", headers={"Authorization": "Bearer guess"})
        assert locked.status_code == 429
        assert locked.json()["error"]["type"] == "rate_limited"
        assert 0 < int(locked.headers["retry-after"]) <= 60
        right = attacker.post(
            "/rpc",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={"method": "sessions.list", "params": {}},
        )
        assert right.status_code == 429, "a locked-out client must not learn a guess was right"
        assert attacker.get("/healthz").status_code == 200
    with client_from("127.0.0.3", url, TOKEN) as other:
        resp = other.post("/rpc", json={"method": "sessions.list", "params": {}})
        assert resp.status_code == 200, "another client is not locked out"
    with redis.Redis.from_url(redis_url) as r:
        assert int(r.get(Keyspace(groups=Settings().groups).auth_failures("127.0.0.2")) or 0) >= 3
        assert r.ttl(Keyspace(groups=Settings().groups).auth_failures("127.0.0.2")) > 0


def test_failures_count_across_api_processes_and_success_resets_no_one(
    locking_app: Callable[[], str],
) -> None:
    """Failures on two apis add up in Redis; another client's success resets nothing."""
    first, second = locking_app(), locking_app()
    with (
        client_from("127.0.0.4", first) as on_first,
        client_from("127.0.0.4", second) as on_second,
        client_from("127.0.0.5", first, TOKEN) as friend,
    ):
        assert on_first.get("/openapi.json").status_code == 401
        assert on_second.get("/openapi.json").status_code == 401
        assert friend.get("/openapi.json").status_code == 200
        assert on_first.get("/openapi.json").status_code == 401  # the third failure
        assert friend.get("/openapi.json").status_code == 200
        assert on_second.get("/openapi.json").status_code == 429
        assert on_first.get("/openapi.json").status_code == 429
        assert friend.get("/openapi.json").status_code == 200


def test_a_client_with_the_right_token_costs_one_lockout_read_a_second_and_guesses_all(
    locking_app: Callable[[], str], redis_url: str
) -> None:
    """After a good request, the next ones within a second skip the lockout read; a guess
    is always checked against the shared count, and un-clears its client at once."""
    first, second = locking_app(), locking_app()
    body = {"method": "sessions.list", "params": {}}
    with (
        client_from("127.0.0.7", first, TOKEN) as good,
        client_from("127.0.0.7", second) as guesser,
        redis.Redis.from_url(redis_url) as r,
    ):
        assert good.post("/rpc", json=body).status_code == 200  # cleared on the first api
        for _ in range(4):  # locked out through the second api
            guesser.post("/rpc", headers={"Authorization": "Bearer guess"})
        assert (
            int(r.get(Keyspace(groups=Settings().groups).auth_failures("127.0.0.7")) or 0) >= 3
        )  # locked out
        assert good.post("/rpc", json=body).status_code == 200, "cleared a moment ago"
        # A guess on the cleared api is counted and refused, and the client is un-cleared:
        # even the right token is refused now.
        assert good.post("/rpc", headers={"Authorization": "Bearer guess"}).status_code == 429
        assert good.post("/rpc", json=body).status_code == 429
        assert (
            guesser.post(
                "/rpc", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
            ).status_code
            == 429
        )


def test_lockout_ends_with_its_window(
    redis_url: str, tmp_path: Any, config: SwitchboardConfig, services: Services
) -> None:
    """Once the window has passed, the client is answered normally again."""
    settings = _settings(redis_url, tmp_path, auth_max_failures=1, auth_failure_window_s=1)
    with serve(create_app(settings, config, services)) as url, client_from("127.0.0.6", url) as c:
        assert c.get("/openapi.json").status_code == 401
        locked = c.get("/openapi.json")
        assert locked.status_code == 429
        time.sleep(int(locked.headers["retry-after"]) + 0.2)
        ok = c.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200


def test_lockout_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """SWITCHBOARD_AUTH_MAX_FAILURES / _AUTH_FAILURE_WINDOW_S set the limit and window."""
    assert (Settings().auth_max_failures, Settings().auth_failure_window_s) == (20, 60)
    monkeypatch.setenv("SWITCHBOARD_AUTH_MAX_FAILURES", "7")
    monkeypatch.setenv("SWITCHBOARD_AUTH_FAILURE_WINDOW_S", "300")
    assert (Settings().auth_max_failures, Settings().auth_failure_window_s) == (7, 300)
