"""`switchboard flower` against a real worker: Flower shows each run's life as a task (its
real runtime, its error), its revoke cancels the run, and the sweep stays out of its list."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
from switchboard_testkit.procs import stop_groups

pytestmark = pytest.mark.integration

AUTH = ("ops", "flower-test-pass")


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def processes(redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A `switchboard worker` and a `switchboard flower` subprocess on the private Redis."""
    port = free_port()
    env = {
        **os.environ,
        "SWITCHBOARD_REDIS_URL": redis_url,
        "SWITCHBOARD_TOKEN": "t",
        "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
        "SWITCHBOARD_LOG_LEVEL": "WARNING",
        "SWITCHBOARD_FLOWER_BASIC_AUTH": ":".join(AUTH),
    }
    env.pop("SWITCHBOARD_CONFIG", None)
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    for args in (
        ["worker", "--concurrency", "4"],
        ["flower", "--address", "127.0.0.1", "--port", str(port)],
    ):
        log = tmp_path / f"{args[0]}.log"
        logs.append(log)
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "switchboard", *args],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    try:
        yield {"url": f"http://127.0.0.1:{port}", "procs": procs, "logs": logs}
    finally:
        stop_groups(procs, timeout_s=20)


def _logs(processes: dict[str, Any]) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in processes["logs"])


def _tasks(http: httpx.Client) -> dict[str, dict[str, Any]]:
    resp = http.get("/api/tasks", auth=AUTH)
    resp.raise_for_status()
    tasks: dict[str, dict[str, Any]] = resp.json()
    return tasks


def _flower_up(http: httpx.Client, processes: dict[str, Any], deadline: float) -> None:
    """Wait for Flower's health check (it needs no auth)."""
    while True:
        for proc in processes["procs"]:
            assert proc.poll() is None, _logs(processes)
        try:
            if http.get("/healthcheck").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, _logs(processes)
        time.sleep(0.2)


def _run(services: Services, key: str, message: str) -> str:
    """Start a run (the echo model) and answer its id."""
    return str(start_run(services, RunRequest(session_key=key, message=message))["runId"])


def _watching(
    http: httpx.Client, processes: dict[str, Any], services: Services, deadline: float
) -> dict[str, Any]:
    """Flower sees events only once it subscribed and the worker is up: start short runs
    until Flower shows one of them ended; answers that run's task."""
    _flower_up(http, processes, deadline)
    while True:
        run_id = _run(services, "agent:main:probe", "hi")
        until = time.monotonic() + 3
        while time.monotonic() < until:
            task = _tasks(http).get(run_id)
            if task is not None and task.get("state") == "SUCCESS":
                return task
            time.sleep(0.2)
        assert time.monotonic() < deadline, _logs(processes)


def _task_when(
    http: httpx.Client, run_id: str, states: set[str], deadline: float, processes: dict[str, Any]
) -> dict[str, Any]:
    """The run's task in Flower once it is in one of ``states``."""
    while True:
        task = _tasks(http).get(run_id)
        if task is not None and task.get("state") in states:
            return task
        assert time.monotonic() < deadline, (task, _logs(processes))
        time.sleep(0.2)


def test_flower_lists_runs_by_name_and_not_the_sweep(
    processes: dict[str, Any], celery_app: Celery, services: Services
) -> None:
    """A run shows in Flower's /api/tasks as `switchboard.run` under its runId, with its
    args, its worker and SUCCESS once it ended; the sweep sends no events (not listed)."""
    deadline = time.monotonic() + 90
    with httpx.Client(base_url=processes["url"], timeout=10) as http:
        _flower_up(http, processes, deadline)
        assert http.get("/api/tasks").status_code == 401  # its API behind basic auth
        assert http.get("/api/tasks", auth=("ops", "wrong")).status_code == 401
        probe = _watching(http, processes, services, deadline)
        assert probe["name"] == "switchboard.run"
        assert probe["worker"].startswith("celery@")
        assert probe["uuid"] in probe["args"]
        for _ in range(3):  # the sweep, as beat sends it: run, never listed
            celery_app.send_task("switchboard.sweep")
        time.sleep(2.0)
        after = _run(services, "agent:main:probe", "again")
        _task_when(http, after, {"SUCCESS"}, deadline, processes)
        names = {t.get("name") for t in _tasks(http).values()}
    assert "switchboard.sweep" not in names, names
    record = services.store.runs.get(after)
    assert record is not None and record.status == "ok"


def test_flower_shows_a_runs_real_runtime_and_session(
    processes: dict[str, Any], services: Services
) -> None:
    """A 3 s run shows STARTED while it runs, then SUCCESS with a runtime of 3 s (not the
    milliseconds its message took), its sessionKey in its kwargs and its reply."""
    deadline = time.monotonic() + 90
    key = "agent:main:flower-slow"
    with httpx.Client(base_url=processes["url"], timeout=10) as http:
        _watching(http, processes, services, deadline)
        run_id = _run(services, key, "/sleep 3\n/reply slept well")
        running = _task_when(http, run_id, {"STARTED", "SUCCESS"}, deadline, processes)
        assert running["state"] == "STARTED", running
        task = _task_when(http, run_id, {"SUCCESS", "FAILURE"}, deadline, processes)
    assert task["state"] == "SUCCESS", task
    assert task["runtime"] >= 2.5, task
    assert f"'sessionKey': '{key}'" in task["kwargs"], task
    assert "'agentId': 'main'" in task["kwargs"], task
    assert "slept well" in task["result"] and "ok" in task["result"], task


def test_flower_shows_a_failed_run_with_its_error(
    processes: dict[str, Any], services: Services
) -> None:
    """A run whose model fails shows FAILURE with its error on one line, no traceback."""
    deadline = time.monotonic() + 90
    with httpx.Client(base_url=processes["url"], timeout=10) as http:
        _watching(http, processes, services, deadline)
        run_id = _run(services, "agent:main:flower-fail", "/fail boom")
        task = _task_when(http, run_id, {"SUCCESS", "FAILURE"}, deadline, processes)
    assert task["state"] == "FAILURE", task
    assert "boom" in task["exception"] and task["exception"].startswith("error:"), task
    assert "\n" not in task["exception"] and not task.get("traceback"), task
    record = services.store.runs.get(run_id)
    assert record is not None and record.status == "error"


def test_flower_revoke_cancels_a_running_run(processes: dict[str, Any], services: Services) -> None:
    """Flower's revoke of a running run's task (its runId) cancels the run: it ends
    `cancelled` within seconds, not after its 30 s, and Flower shows it REVOKED."""
    deadline = time.monotonic() + 90
    with httpx.Client(base_url=processes["url"], timeout=10) as http:
        _watching(http, processes, services, deadline)
        run_id = _run(services, "agent:main:flower-revoke", "/sleep 30")
        _task_when(http, run_id, {"STARTED"}, deadline, processes)
        revoked_at = time.monotonic()
        resp = http.post(f"/api/task/revoke/{run_id}", auth=AUTH)
        assert resp.status_code == 200, resp.text
        record = services.store.runs.get(run_id)
        while record is not None and not record.terminal:
            assert time.monotonic() - revoked_at < 10, (record, _logs(processes))
            time.sleep(0.1)
            record = services.store.runs.get(run_id)
        assert record is not None and record.status == "cancelled", record
        task = _task_when(http, run_id, {"REVOKED"}, deadline, processes)
    assert task["runtime"] < 10, task
