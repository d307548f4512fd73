"""Every route but the public ones needs the token; repeated wrong tokens lock a guesser out.

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
from switchboard.api.auth import proxy_options
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
def serve(app: FastAPI, **options: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port (all of 127.0.0.0/8 reaches it),
    with `switchboard api`'s proxy options (none trusted) unless given others."""
    options = options or proxy_options(Settings())
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", **options)
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


def test_repeated_wrong_tokens_lock_the_address_out_but_never_the_right_token(
    locking_app: Callable[[], str], redis_url: str
) -> None:
    """After 3 wrong tokens: 429 + Retry-After to wrong ones; the right token still works."""
    url = locking_app()
    body = {"method": "sessions.list", "params": {}}
    with client_from("127.0.0.2", url) as attacker:
        for _ in range(3):
            assert (
                attacker.post("/rpc", headers={"Authorization": "Bearer guess"}).status_code == 401
            )
        locked = attacker.post("/rpc", headers={"Authorization": "Bearer guess"})
        assert locked.status_code == 429
        assert locked.json()["error"]["type"] == "rate_limited"
        assert 0 < int(locked.headers["retry-after"]) <= 60
        right = attacker.post("/rpc", headers={"Authorization": f"Bearer {TOKEN}"}, json=body)
        assert right.status_code == 200, "the lockout never refuses the right token"
        assert attacker.post("/rpc", headers={"Authorization": "Bearer x"}).status_code == 429
        assert attacker.get("/healthz").status_code == 200
    with client_from("127.0.0.3", url, TOKEN) as other:
        resp = other.post("/rpc", json={"method": "sessions.list", "params": {}})
        assert resp.status_code == 200, "another client is not locked out"
    with redis.Redis.from_url(redis_url) as r:
        assert int(r.get(_failures_key("127.0.0.2")) or 0) >= 3
        assert r.ttl(_failures_key("127.0.0.2")) > 0


def _failures_key(client: str) -> str:
    return Keyspace(groups=Settings().groups).auth_failures(client)


def test_requests_without_a_credential_and_preflights_cost_nothing(
    locking_app: Callable[[], str], redis_url: str
) -> None:
    """25 requests with no token and 5 CORS preflights: each 401, none counted, and a
    wrong token after them is still answered 401 (not locked), the right one 200."""
    url = locking_app()
    with client_from("127.0.0.11", url) as page:
        for _ in range(25):
            assert page.post("/rpc", json={"method": "sessions.list"}).status_code == 401
        for _ in range(5):
            preflight = page.options(
                "/rpc",
                headers={
                    "Origin": "https://evil.example",
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization",
                },
            )
            assert preflight.status_code == 401
        assert page.get("/openapi.json", headers={"Authorization": "Bearer"}).status_code == 401
        with redis.Redis.from_url(redis_url) as r:
            assert r.get(_failures_key("127.0.0.11")) is None, "no credential, no count"
        assert page.get("/openapi.json", headers={"Authorization": "Bearer x"}).status_code == 401
        ok = page.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200


def test_failures_count_across_api_processes_and_success_resets_no_one(
    locking_app: Callable[[], str],
) -> None:
    """Failures on two apis add up in Redis; another client's success resets nothing."""
    first, second = locking_app(), locking_app()
    wrong = {"Authorization": "Bearer wrong"}
    with (
        client_from("127.0.0.4", first) as on_first,
        client_from("127.0.0.4", second) as on_second,
        client_from("127.0.0.5", first, TOKEN) as friend,
    ):
        assert on_first.get("/openapi.json", headers=wrong).status_code == 401
        assert on_second.get("/openapi.json", headers=wrong).status_code == 401
        assert friend.get("/openapi.json").status_code == 200
        assert on_first.get("/openapi.json", headers=wrong).status_code == 401  # the third
        assert friend.get("/openapi.json").status_code == 200
        assert on_second.get("/openapi.json", headers=wrong).status_code == 429
        assert on_first.get("/openapi.json", headers=wrong).status_code == 429
        assert friend.get("/openapi.json").status_code == 200


def test_a_locked_out_address_still_serves_a_live_scoped_token(
    locking_app: Callable[[], str], services: Services
) -> None:
    """A wrong scoped token counts and is locked out; a live scoped token is never refused."""
    url = locking_app()
    scoped = services.store.tokens.create("main").token
    body = {"tool": "sessions_list", "args": {}}
    with client_from("127.0.0.7", url) as c:
        for _ in range(4):
            c.post("/rpc", headers={"Authorization": "Bearer sbt_guess"})
        assert c.post("/rpc", headers={"Authorization": "Bearer sbt_x"}).status_code == 429
        live = c.post("/tools/invoke", json=body, headers={"Authorization": f"Bearer {scoped}"})
        assert live.status_code == 200, live.text


def test_lockout_ends_with_its_window(
    redis_url: str, tmp_path: Any, config: SwitchboardConfig, services: Services
) -> None:
    """Once the window has passed, a wrong token is answered 401 again, not 429."""
    settings = _settings(redis_url, tmp_path, auth_max_failures=1, auth_failure_window_s=1)
    wrong = {"Authorization": "Bearer wrong"}
    with serve(create_app(settings, config, services)) as url, client_from("127.0.0.6", url) as c:
        assert c.get("/openapi.json", headers=wrong).status_code == 401
        locked = c.get("/openapi.json", headers=wrong)
        assert locked.status_code == 429
        time.sleep(int(locked.headers["retry-after"]) + 0.2)
        assert c.get("/openapi.json", headers=wrong).status_code == 401


def test_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy(
    redis_url: str, tmp_path: Any, config: SwitchboardConfig, services: Services
) -> None:
    """Untrusted peer: a rotating X-Forwarded-For neither escapes its lockout nor charges
    the named address; a trusted proxy's header names the client that is counted."""
    settings = _settings(
        redis_url, tmp_path, auth_max_failures=2, trusted_proxies="127.0.0.13, 10.9.0.0/16"
    )
    app = create_app(settings, config, services)
    with serve(app, **proxy_options(settings)) as url, redis.Redis.from_url(redis_url) as r:
        with client_from("127.0.0.12", url) as direct:
            answers = [
                direct.get(
                    "/openapi.json",
                    headers={"Authorization": "Bearer x", "X-Forwarded-For": f"203.0.113.{i}"},
                ).status_code
                for i in range(4)
            ]
            assert answers == [401, 401, 429, 429], "the header does not rotate the address"
            assert r.get(_failures_key("203.0.113.1")) is None, "nor charges the named one"
        with client_from("127.0.0.13", url) as proxy:
            for _ in range(3):
                proxy.get(
                    "/openapi.json",
                    headers={"Authorization": "Bearer x", "X-Forwarded-For": "198.51.100.7"},
                )
            assert int(r.get(_failures_key("198.51.100.7")) or 0) == 3
            assert r.get(_failures_key("127.0.0.13")) is None
            other = proxy.get(
                "/openapi.json",
                headers={"Authorization": "Bearer x", "X-Forwarded-For": "198.51.100.8"},
            )
            assert other.status_code == 401, "another client behind the proxy is not locked"


def test_no_proxy_is_trusted_by_default() -> None:
    """Unset SWITCHBOARD_TRUSTED_PROXIES: uvicorn's proxy headers are off (not loopback's)."""
    assert proxy_options(Settings())["proxy_headers"] is False
    options = proxy_options(Settings(trusted_proxies=" 10.0.0.5 ,10.1.0.0/16"))
    assert options == {"proxy_headers": True, "forwarded_allow_ips": "10.0.0.5,10.1.0.0/16"}
    with pytest.raises(ValueError, match="not an address"):
        Settings(trusted_proxies="proxy.example")


def test_lockout_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """SWITCHBOARD_AUTH_MAX_FAILURES / _AUTH_FAILURE_WINDOW_S set the limit and window."""
    assert (Settings().auth_max_failures, Settings().auth_failure_window_s) == (20, 60)
    monkeypatch.setenv("SWITCHBOARD_AUTH_MAX_FAILURES", "7")
    monkeypatch.setenv("SWITCHBOARD_AUTH_FAILURE_WINDOW_S", "300")
    assert (Settings().auth_max_failures, Settings().auth_failure_window_s) == (7, 300)


def test_the_console_session_cookie_is_secure_behind_an_https_proxy(
    redis_url: str, tmp_path: Any, config: SwitchboardConfig, services: Services
) -> None:
    """Through a trusted proxy that says https, the events cookie is also `Secure`."""
    settings = _settings(redis_url, tmp_path, trusted_proxies="127.0.0.14")
    app = create_app(settings, config, services)
    with serve(app, **proxy_options(settings)) as url, client_from("127.0.0.14", url) as c:
        login = c.post(
            "/console/login",
            headers={"Authorization": f"Bearer {TOKEN}", "X-Forwarded-Proto": "https"},
        )
        cookie = login.headers["set-cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie and TOKEN not in cookie
