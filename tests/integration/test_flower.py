"""`switchboard flower` against a real worker: Flower lists the product's tasks by name."""

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


def test_flower_lists_the_product_tasks_by_name(
    processes: dict[str, Any], celery_app: Celery, services: Services
) -> None:
    """A sweep and an agent run show up in Flower's /api/tasks with names, args and state."""
    deadline = time.monotonic() + 90
    with httpx.Client(base_url=processes["url"], timeout=10) as http:
        # Flower up (its health check needs no auth)...
        while True:
            for proc in processes["procs"]:
                assert proc.poll() is None, _logs(processes)
            try:
                if http.get("/healthcheck").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, _logs(processes)
            time.sleep(0.2)
        # ...and its API behind basic auth.
        assert http.get("/api/tasks").status_code == 401
        assert http.get("/api/tasks", auth=("ops", "wrong")).status_code == 401

        # Flower only sees events published after it subscribed, and the worker may still be
        # starting: send the (idempotent) sweep until Flower has seen one run to completion.
        while True:
            celery_app.send_task("switchboard.sweep")
            time.sleep(1.0)
            sweeps = [t for t in _tasks(http).values() if t.get("name") == "switchboard.sweep"]
            if any(t.get("state") == "SUCCESS" for t in sweeps):
                break
            assert time.monotonic() < deadline, (sweeps, _logs(processes))

        # A real agent run through the system: its task carries the run id in its args.
        accepted = start_run(services, RunRequest(session_key="agent:main:main", message="hi"))
        run_id = accepted["runId"]
        while True:
            runs = [
                t
                for t in _tasks(http).values()
                if t.get("name") == "switchboard.run" and run_id in str(t.get("args"))
            ]
            if runs and runs[0].get("state") == "SUCCESS":
                break
            assert time.monotonic() < deadline, (runs, _logs(processes))
            time.sleep(0.2)
    # The task succeeds once its run is claimed (the run goes on on the worker's loop): the
    # run itself ends a moment later.
    record = services.store.runs.get(run_id)
    while record is not None and record.status != "ok" and time.monotonic() < deadline:
        time.sleep(0.1)
        record = services.store.runs.get(run_id)
    assert record is not None and record.status == "ok"
    assert runs[0]["worker"].startswith("celery@")
