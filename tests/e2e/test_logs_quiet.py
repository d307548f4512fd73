"""Logs as a user reads them: an idle stack is quiet at INFO, and Redis going away is one
WARNING line per failed request, without a traceback."""

from __future__ import annotations

import json
import os
import pty
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from switchboard.supervisor.redis_server import RedisServer
from switchboard_testkit.up import clean_env, free_port, start_up

pytestmark = pytest.mark.e2e

TOKEN = "logs-test-token-123456"


def _levels(lines: list[str]) -> list[tuple[str, str]]:
    """(level, line) for each JSON log line (a `name | ` prefix from `up` is skipped)."""
    found = []
    for line in lines:
        text = line.split(" | ", 1)[-1].strip()
        if text.startswith("{"):
            found.append((str(json.loads(text).get("level")), line))
    return found


def test_an_idle_stack_writes_no_info_line(tmp_path: Path) -> None:
    """`switchboard up` left idle for 12 s after startup settles: no INFO line (the sweep
    runs every 5 s; Celery's lines about it are DEBUG, and an idle sweep logs nothing)."""
    with start_up(tmp_path, {}) as up:
        time.sleep(6)  # the worker's ready lines, beat's first tick
        settled = len(up.lines)
        time.sleep(12)
        idle = up.lines[settled:]
    info = [line for level, line in _levels(idle) if level == "info"]
    assert info == [], "".join(info)


def test_a_run_is_one_info_line_and_a_model_error_no_traceback(tmp_path: Path) -> None:
    """At INFO a run writes one line, its end (a model's failure named in it, without a
    traceback), and the worker neither prints Celery's banner nor a multi-line warning."""
    with start_up(tmp_path, {}) as up:
        time.sleep(4)  # the worker's ready lines
        settled = len(up.lines)
        headers = {"Authorization": f"Bearer {up.token}"}
        with httpx.Client(base_url=up.url, headers=headers, timeout=30) as http:
            for message in ("hello", "/fail the provider is down"):
                started = http.post(
                    "/rpc", json={"method": "agent", "params": {"message": message}}
                )
                run_id = started.json()["runId"]
                params = {"runId": run_id, "timeoutMs": 20_000}
                http.post("/rpc", json={"method": "agent.wait", "params": params})
        time.sleep(1)
        startup, written = up.lines[:settled], up.lines[settled:]
    info = [line for level, line in _levels(written) if level == "info"]
    assert len(info) == 2, "".join(written)
    assert all("ended" in line for line in info)
    assert "the provider is down" in info[1] and '"status": "error"' in info[1]
    assert "Traceback" not in "".join(up.lines)
    assert "-------------- celery@" not in "".join(startup)  # no banner at INFO
    for line in startup:  # Celery's warning about running as root (when it does): one line
        text = line.split(" | ", 1)[-1].strip()
        if text.startswith("{") and "SecurityWarning" in text:
            assert "\n" not in json.loads(text)["event"], text


class Api:
    """A `switchboard api` process and the lines it wrote on stderr."""

    def __init__(self, redis_url: str, workdir: Path) -> None:
        self.port = free_port()
        env = {
            **clean_env(),
            "SWITCHBOARD_REDIS_URL": redis_url,
            "SWITCHBOARD_TOKEN": TOKEN,
            "SWITCHBOARD_DATA_DIR": str(workdir),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "switchboard", "api", "--port", str(self.port)],
            cwd=workdir,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        stderr = self.proc.stderr
        assert stderr is not None
        threading.Thread(target=lambda: self.lines.extend(stderr), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout_s: float = 60) -> None:
        """Until /healthz answers 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("the api never became healthy:\n" + "".join(self.lines))


@pytest.fixture
def api_and_redis(tmp_path: Path) -> Iterator[tuple[Api, RedisServer]]:
    """A real Redis and a `switchboard api` using it; both stopped afterwards."""
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.data_dir.mkdir(parents=True)
    redis_server.start()
    api = Api(redis_server.url, tmp_path)
    try:
        api.wait_healthy()
        yield api, redis_server
    finally:
        api.proc.terminate()
        api.proc.wait(timeout=30)
        redis_server.stop()


def test_redis_stopped_is_a_503_and_one_warning_line(
    api_and_redis: tuple[Api, RedisServer],
) -> None:
    """With Redis stopped, a request gets 503 and the api logs exactly one WARNING line for
    it (naming the request), no error line and no traceback."""
    api, redis_server = api_and_redis
    redis_server.stop()
    time.sleep(3)  # the api notices the outage on its own (its run-event listener)
    before = len(api.lines)
    resp = httpx.post(
        f"{api.url}/rpc",
        json={"method": "sessions.list", "params": {}},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert resp.status_code == 503, resp.text
    time.sleep(2)  # anything the request logs late
    written = api.lines[before:]
    warnings = [line for level, line in _levels(written) if level == "warning"]
    assert len(warnings) == 1, "".join(written)
    assert "/rpc" in warnings[0] and "503" in warnings[0]
    assert not [line for level, line in _levels(written) if level in ("error", "critical")]
    assert "Traceback" not in "".join(api.lines)


def test_a_client_gone_mid_request_is_one_warning_line(
    api_and_redis: tuple[Api, RedisServer],
) -> None:
    """A client that closes its connection halfway through a request body: one WARNING
    line naming the request, no "500, unhandled error", no server error line, no
    traceback."""
    api, _ = api_and_redis
    time.sleep(1)  # startup lines written
    before = len(api.lines)
    head = (
        "POST /rpc HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", api.port)) as conn:
        conn.sendall(head.encode() + b'{"method": "ses')
        time.sleep(0.5)
    time.sleep(2)
    written = api.lines[before:]
    levels = _levels(written)
    assert [level for level, _ in levels] == ["warning"], "".join(written)
    assert "POST /rpc" in levels[0][1] and "went away" in levels[0][1]
    assert "500" not in levels[0][1] and "Traceback" not in "".join(api.lines)


def _start(
    role: str, env: dict[str, str], workdir: Path, lines: list[str]
) -> subprocess.Popen[str]:
    """`switchboard <role>` with its output collected into ``lines``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchboard", role],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = proc.stdout
    assert out is not None
    threading.Thread(target=lambda: lines.extend(f"{role} | {x}" for x in out), daemon=True).start()
    return proc


def test_worker_and_beat_ride_out_a_redis_outage_in_warning_lines(tmp_path: Path) -> None:
    """Redis stopped for 8 s under a running worker and beat (sweeping every second): their
    lines about it are WARNINGs, with no ERROR line and no traceback."""
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.data_dir.mkdir(parents=True)
    redis_server.start()
    env = {
        **clean_env(),
        "SWITCHBOARD_REDIS_URL": redis_server.url,
        "SWITCHBOARD_DATA_DIR": str(tmp_path),
        "SWITCHBOARD_SWEEP_INTERVAL_S": "1",
    }
    lines: list[str] = []
    procs = [_start(role, env, tmp_path, lines) for role in ("worker", "beat")]
    try:
        deadline = time.monotonic() + 60
        while not any("ready" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)
        before = len(lines)
        redis_server.stop()
        time.sleep(8)
        redis_server.start()
        time.sleep(6)
        during = lines[before:]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        redis_server.stop()
    levels = _levels(during)
    assert any(level == "warning" for level, _ in levels), "".join(during)
    assert not [line for level, line in levels if level in ("error", "critical")], "".join(during)
    assert "Traceback" not in "".join(lines)


def _api_output(redis_url: str, workdir: Path, *, tty: bool, fmt: str | None = None) -> str:
    """What `switchboard api` writes until its startup completes, into a terminal (a pty)
    or a pipe."""
    env = {**clean_env(), "SWITCHBOARD_REDIS_URL": redis_url, "SWITCHBOARD_TOKEN": TOKEN}
    if fmt is not None:
        env["SWITCHBOARD_LOG_FORMAT"] = fmt
    command = [sys.executable, "-m", "switchboard", "api", "--port", str(free_port())]
    reader, writer = pty.openpty() if tty else os.pipe()
    proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=writer, stderr=writer)
    os.close(writer)
    out = b""
    try:
        deadline = time.monotonic() + 60
        while b"startup complete" not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([reader], [], [], 0.5)
            if ready:
                try:
                    out += os.read(reader, 65536)
                except OSError:  # the pty closed: the process ended
                    break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        os.close(reader)
    text = out.decode(errors="replace")
    assert "startup complete" in text, text
    return text


def test_a_terminal_gets_readable_lines_and_a_pipe_json_lines(tmp_path: Path) -> None:
    """Logs in a terminal are lines for a human; in a pipe, or with
    SWITCHBOARD_LOG_FORMAT=json, one JSON object per line."""
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.data_dir.mkdir(parents=True)
    redis_server.start()
    try:
        terminal = _api_output(redis_server.url, tmp_path, tty=True)
        piped = _api_output(redis_server.url, tmp_path, tty=False)
        forced = _api_output(redis_server.url, tmp_path, tty=True, fmt="json")
    finally:
        redis_server.stop()
    lines = [line for line in terminal.splitlines() if line.strip()]
    assert lines and not any(line.lstrip().startswith("{") for line in lines), terminal
    assert any("info" in line.lower() and "startup complete" in line for line in lines)
    for text in (piped, forced):
        events = [json.loads(line) for line in text.splitlines() if line.strip()]
        assert any(e["event"].startswith("Application startup complete") for e in events)
