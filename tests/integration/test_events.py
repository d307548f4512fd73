"""`GET /events` over real HTTP: auth (header, query token, console cookie), run and delivery
events from a real worker, the session filter, Last-Event-ID resume and heartbeats."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from switchboard.api import events as events_api
from switchboard.api.console_session import issue_session
from switchboard.api.events import EVENTS_COOKIE
from switchboard.shared.config import Settings
from switchboard.shared.delivery import Target, enqueue_delivery
from switchboard.shared.services import Services
from switchboard_testkit.sse import Sse, sse_events, until

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
OTHER = "agent:main:other"


@pytest.fixture
def anon(api_url: str) -> Iterator[httpx.Client]:
    """A client without the bearer header."""
    with httpx.Client(base_url=api_url, timeout=15) as c:
        yield c


@pytest.fixture
def token(settings: Settings) -> str:
    """The api token."""
    assert settings.token
    return str(settings.token)


def _ended(run_id: str) -> Callable[[Sse], bool]:
    return lambda ev: ev.event == "run.ended" and ev.data.get("runId") == run_id


def test_events_refuse_a_missing_or_wrong_token(anon: httpx.Client) -> None:
    """No credential, a wrong ?token= or a wrong cookie is 401 with the JSON error body."""
    for params, cookies in [({}, {}), ({"token": "nope"}, {}), ({}, {"switchboard_events": "x"})]:
        anon.cookies.clear()
        for name, value in cookies.items():
            anon.cookies.set(name, value)
        resp = anon.get("/events", params=params)
        assert resp.status_code == 401, (params, cookies, resp.text)
        assert resp.json()["error"]["type"] == "unauthorized"


def test_a_run_streams_started_then_ended(
    worker: Any, anon: httpx.Client, rpc: Callable[..., Any], token: str
) -> None:
    """With ?token=, a run's run.started and run.ended (status, reply) arrive in order."""
    with anon.stream("GET", "/events", params={"token": token}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        stream = sse_events(resp)
        ready = next(stream)
        assert ready.event == "ready" and ready.retry == events_api.RETRY_MS
        run_id = rpc("agent", sessionKey="main", message="hello stream")["runId"]
        seen = [ev for ev in until(stream, _ended(run_id)) if ev.data.get("runId") == run_id]
    assert [ev.event for ev in seen] == ["run.started", "run.ended"]
    assert seen[0].data["sessionKey"] == MAIN and seen[0].data["attempt"] == 1
    assert seen[1].data["status"] == "ok" and seen[1].data["reply"] == "hello stream"
    assert seen[1].data["messages"] >= 1
    assert seen[0].id is not None and seen[1].id is not None
    assert _id(seen[0].id) < _id(seen[1].id)


def test_the_session_filter_keeps_one_session(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any]
) -> None:
    """?sessionKey=main (resolved to its canonical key) drops other sessions' events."""
    with client.stream("GET", "/events", params={"sessionKey": "main"}) as resp:
        stream = sse_events(resp)
        assert next(stream).event == "ready"
        other = rpc("agent", sessionKey=OTHER, message="elsewhere")["runId"]
        rpc("agent.wait", runId=other, timeoutMs=20_000)
        mine = rpc("agent", sessionKey="main", message="here")["runId"]
        seen = until(stream, _ended(mine))
    keys = {ev.data.get("sessionKey") for ev in seen if ev.event.startswith("run.")}
    assert keys == {MAIN}
    assert all(ev.data.get("runId") != other for ev in seen)


def test_last_event_id_resumes_after_that_event(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any]
) -> None:
    """A reconnect with Last-Event-ID gets exactly the events after it, in stream order."""
    first = rpc("agent", sessionKey="main", message="one")["runId"]
    rpc("agent.wait", runId=first, timeoutMs=20_000)
    second = rpc("agent", sessionKey="main", message="two")["runId"]
    rpc("agent.wait", runId=second, timeoutMs=20_000)
    with client.stream("GET", "/events", headers={"Last-Event-ID": "0-0"}) as resp:
        everything = until(sse_events(resp), _ended(second))
    first_ended = next(ev for ev in everything if _ended(first)(ev))
    assert first_ended.id is not None
    with client.stream("GET", "/events", headers={"Last-Event-ID": first_ended.id}) as resp:
        stream = sse_events(resp)
        ready = next(stream)
        assert ready.event == "ready" and ready.data["lastEventId"] == first_ended.id
        resumed = until(stream, _ended(second))
    expected = [ev for ev in everything if ev.id and _id(ev.id) > _id(first_ended.id)]
    assert [(ev.event, ev.id) for ev in resumed] == [(ev.event, ev.id) for ev in expected]
    assert [ev.data.get("runId") for ev in resumed] == [second, second]


def test_the_console_cookie_opens_the_stream(anon: httpx.Client, token: str) -> None:
    """POST /console/login (bearer) sets an HttpOnly cookie for /events that authenticates it."""
    assert anon.post("/console/login").status_code == 401
    login = anon.post("/console/login", headers={"Authorization": f"Bearer {token}"})
    assert login.status_code == 200
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "Path=/events" in cookie and "SameSite=strict" in cookie
    with anon.stream("GET", "/events") as resp:
        assert resp.status_code == 200
        assert next(sse_events(resp)).event == "ready"
    anon.post("/console/logout", headers={"Authorization": f"Bearer {token}"})
    assert anon.get("/events").status_code == 401


def test_the_console_session_is_derived_from_the_token_and_expires(
    anon: httpx.Client, token: str
) -> None:
    """The login answers a session credential (never the token itself, in the answer or
    the cookie) that acts as the owner until it expires; a forged or expired one is 401,
    and a login with the session gives back the same one (it is not renewed)."""
    login = anon.post("/console/login", headers={"Authorization": f"Bearer {token}"})
    answer, cookie = login.json(), login.headers["set-cookie"]
    session = answer["session"]
    assert session.startswith("sbs_") and token not in session and token not in cookie
    assert f"{EVENTS_COOKIE}={session}" in cookie and "Max-Age=" in cookie
    assert "Secure" not in cookie  # plain http here; https adds it
    assert 11 * 3600 < answer["expiresAt"] / 1000 - time.time() <= 12 * 3600
    as_session = {"Authorization": f"Bearer {session}"}
    listed = anon.post("/rpc", json={"method": "sessions.list", "params": {}}, headers=as_session)
    assert listed.status_code == 200
    again = anon.post("/console/login", headers=as_session).json()
    assert again["session"] == session, "a session does not renew itself"
    expired = issue_session(token, ttl_s=-1)
    forged = issue_session("another-token")
    for bad in (expired, forged, session[:-2] + "xx"):
        resp = anon.post(
            "/rpc", json={"method": "sessions.list"}, headers={"Authorization": f"Bearer {bad}"}
        )
        assert resp.status_code == 401, bad
    anon.cookies.clear()
    anon.cookies.set(EVENTS_COOKIE, expired, path="/events")
    assert anon.get("/events").status_code == 401


def test_an_idle_stream_sends_heartbeats(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing happening, a `: heartbeat` comment arrives every HEARTBEAT_S."""
    monkeypatch.setattr(events_api, "HEARTBEAT_S", 0.3)
    with client.stream("GET", "/events") as resp:
        seen = until(sse_events(resp), lambda ev: ev.event == "comment", limit=3)
    assert seen[-1].comment == "heartbeat"


def test_a_settled_delivery_is_an_event(
    worker: Any, services: Services, client: httpx.Client
) -> None:
    """A delivery's final status arrives as delivery.settled with its session key."""
    with client.stream("GET", "/events") as resp:
        stream = sse_events(resp)
        assert next(stream).event == "ready"
        delivery_id = enqueue_delivery(
            services,
            target=Target(channel="internal", to="ops"),
            message="note",
            session_key=MAIN,
            idempotency_key="evt-1",
            origin={"kind": "test"},
        )
        seen = until(stream, lambda ev: ev.event == "delivery.settled")
    assert seen[-1].data["deliveryId"] == delivery_id
    assert seen[-1].data["status"] == "delivered" and seen[-1].data["sessionKey"] == MAIN


@pytest.mark.parametrize("bad", ["yesterday", "1-2-3-4", "-1", "1-2-99999"])
def test_a_malformed_last_event_id_is_a_clear_400(client: httpx.Client, bad: str) -> None:
    """A resume point that is not a stream id is refused before the stream starts."""
    resp = client.get("/events", headers={"Last-Event-ID": bad})
    assert resp.status_code == 400
    assert "Last-Event-ID" in resp.json()["error"]["message"]


def _id(event_id: str) -> tuple[int, ...]:
    """An event id's place in the stream's order: (ms, seq[, slot group])."""
    return tuple(int(part) for part in event_id.split("-"))


@pytest.mark.e2e
def test_the_api_stops_on_sigint_with_a_stream_open(redis_url: str) -> None:
    """`switchboard api` exits promptly on Ctrl-C while a client follows /events."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env.update(
        SWITCHBOARD_REDIS_URL=redis_url, SWITCHBOARD_TOKEN="t", SWITCHBOARD_LOG_LEVEL="WARNING"
    )
    command = [sys.executable, "-m", "switchboard", "api", "--port", str(port)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        with httpx.stream("GET", f"{url}/events", params={"token": "t"}, timeout=30) as resp:
            assert next(sse_events(resp)).event == "ready"
            started = time.monotonic()
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=20)
            stopped_s = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert stopped_s < 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("the api did not become healthy")
