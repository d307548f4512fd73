"""`switchboard up` as a user starts it: embedded Redis, api, worker, beat, a real model client."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
import redis

from switchboard_testkit.fake_model import FakeModelServer
from switchboard_testkit.up import clean_env, start_up

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    """The project's OpenAI-compatible fake model server on loopback."""
    with FakeModelServer() as server:
        yield server


class Running:
    """A started `switchboard up` and what it printed."""

    def __init__(self, proc: subprocess.Popen[str], url: str, token: str, workdir: Path) -> None:
        self.proc, self.url, self.token, self.workdir = proc, url, token, workdir
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        )

    def rpc(self, method: str, **params: Any) -> Any:
        resp = self.http.post("/rpc", json={"method": method, "params": params})
        assert resp.status_code == 200, resp.text
        return resp.json()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "switchboard", *args, "--url", self.url],
            cwd=self.workdir,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture(scope="module")
def up(fake_model: FakeModelServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """`switchboard up` in a fresh directory, configured with the fake model as provider."""
    config = {
        "models": {
            "providers": {
                "fake": {"baseUrl": fake_model.base_url, "apiKey": "k", "api": "openai-completions"}
            }
        },
        "agents": {"defaults": {"model": "fake/fake-1"}},
    }
    with start_up(tmp_path_factory.mktemp("up"), config) as started:
        yield Running(started.proc, started.url, started.token, started.workdir)


def test_agent_and_wait_through_the_real_model_client(
    up: Running, fake_model: FakeModelServer
) -> None:
    """A run goes through the OpenAI-compatible client to the model server and back."""
    fake_model.reset()
    started = up.rpc("agent", sessionKey="main", message="hello model")
    assert started["status"] == "accepted"
    outcome = up.rpc("agent.wait", runId=started["runId"], timeoutMs=30_000)
    assert outcome["status"] == "ok", outcome
    assert outcome["reply"] == "hello model"
    (request,) = fake_model.requests()
    assert request["model"] == "fake-1"
    assert request["messages"][-1]["content"] == "hello model"


def test_cli_send_history_and_sessions(up: Running) -> None:
    """`switchboard send`, `history` and `sessions` work against the running service."""
    sent = up.cli("send", "main", "from the terminal")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == "from the terminal"
    hist = up.cli("history", "main")
    assert hist.returncode == 0, hist.stderr
    assert "user: from the terminal" in hist.stdout
    assert "assistant: from the terminal" in hist.stdout
    listing = up.cli("sessions")
    assert listing.returncode == 0, listing.stderr
    assert "agent:main:main" in listing.stdout


def test_cli_spawn_waits_for_the_child_and_the_announce_reaches_the_requester(
    up: Running,
) -> None:
    """`switchboard spawn` starts a sub-agent; its result is announced into `main`."""
    spawned = up.cli("spawn", "count the lighthouses", "--label", "lights", "--timeout", "30")
    assert spawned.returncode == 0, spawned.stderr
    first, _, reply = spawned.stdout.partition("\n")
    assert re.fullmatch(r"spawned agent:main:subagent:[0-9a-f-]+ \(run \S+\)", first), first
    assert "count the lighthouses" in reply
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        hist = up.cli("history", "main", "--limit", "5")
        if "lights" in hist.stdout and "Status" in hist.stdout:
            break
        time.sleep(0.3)
    assert "Status" in hist.stdout and "count the lighthouses" in hist.stdout, hist.stdout
    refused = up.cli("spawn", "x", "--agent", "nobody")
    assert refused.returncode == 1
    assert "forbidden" in refused.stderr or "error" in refused.stderr


def test_data_survives_in_the_embedded_redis_append_only_file(up: Running) -> None:
    """The embedded Redis keeps its data under ./.switchboard with append-only persistence."""
    redis_dir = up.workdir / ".switchboard" / "redis"
    assert redis_dir.is_dir()
    assert any(p.name.startswith("appendonly") for p in redis_dir.iterdir())


def test_nobody_locks_the_owner_out_and_forged_forwarding_does_not_help(up: Running) -> None:
    """Against `up`: 30 requests without a token and 5 CORS preflights cost nothing; 25
    wrong tokens with a rotating X-Forwarded-For (no proxy is trusted) lock out wrong
    tokens from this address, never the right one."""
    with httpx.Client(base_url=up.url, timeout=30) as page:
        for _ in range(30):
            assert page.post("/rpc", json={"method": "sessions.list"}).status_code == 401
        for _ in range(5):
            preflight = page.options(
                "/rpc",
                headers={"Origin": "https://a.example", "Access-Control-Request-Method": "POST"},
            )
            assert preflight.status_code == 401
        answers = [
            page.post(
                "/rpc",
                headers={"Authorization": f"Bearer wrong{i}", "X-Forwarded-For": f"198.51.100.{i}"},
            ).status_code
            for i in range(25)
        ]
    assert answers[:20] == [401] * 20, "the no-token requests counted"
    assert answers[20:] == [429] * 5, "a rotated X-Forwarded-For escaped the lockout"
    assert up.rpc("sessions.list")["sessions"] is not None  # the right token: still served
    bad_schema: dict[str, Any] = {"type": "string"}
    for _ in range(150):
        bad_schema = {"type": "object", "properties": {"a": bad_schema}}
    deep = up.http.post(
        "/tools/invoke",
        json={
            "tool": "sessions_spawn",
            "args": {"task": "x", "collect": True, "outputSchema": bad_schema},
        },
    )
    assert deep.status_code == 400 and "deeper than 64 levels" in deep.text


def test_the_embedded_redis_requires_its_generated_password(up: Running) -> None:
    """The embedded Redis refuses a client without the password (kept 0600 in the data
    dir, never in stack.json or on a command line); commands that find the stack reach it."""
    data_dir = up.workdir / ".switchboard"
    password_file = data_dir / "redis.password"
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    password = password_file.read_text().strip()
    assert len(password) >= 32
    runfile = data_dir / "stack.json"
    assert password not in runfile.read_text()
    stack = json.loads(runfile.read_text())
    assert stack["redis_auth"] is True
    url = urlsplit(stack["redis_url"])
    with (
        redis.Redis(host=url.hostname, port=url.port, socket_timeout=5) as anonymous,
        pytest.raises(redis.AuthenticationError),
    ):
        anonymous.get("anything")
    with redis.Redis(host=url.hostname, port=url.port, password=password) as owner:
        assert owner.ping()
    lines = [" ".join(p.cmdline()) for p in psutil.Process(up.proc.pid).children(recursive=True)]
    assert not any(password in line for line in lines), "the password is on a command line"
    found = subprocess.run(
        [sys.executable, "-m", "switchboard", "check-health"],
        cwd=up.workdir,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert password not in found.stdout + found.stderr
    sent = subprocess.run(
        [sys.executable, "-m", "switchboard", "send", "main", "beside up"],
        cwd=up.workdir,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == "beside up"


def test_ctrl_c_stops_every_process(up: Running) -> None:
    """SIGINT to `up` stops api, worker, beat and the embedded redis-server: no orphans."""
    parent = psutil.Process(up.proc.pid)
    children = parent.children(recursive=True)
    assert any("redis-server" in " ".join(c.cmdline()) for c in children)
    assert len(children) >= 4
    os.kill(up.proc.pid, signal.SIGINT)
    up.proc.wait(timeout=40)
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
