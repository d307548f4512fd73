"""Worker loss: a run whose worker is killed mid-run completes exactly once on a new worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services

pytestmark = [pytest.mark.integration, pytest.mark.faults]


@pytest.fixture
def spawn(redis_url: str, tmp_path: Path) -> Iterator[object]:
    """Start `switchboard <command>` subprocesses; all are killed at teardown."""
    procs: list[subprocess.Popen[bytes]] = []
    env = {
        **os.environ,
        "SWITCHBOARD_REDIS_URL": redis_url,
        "SWITCHBOARD_TOKEN": "t",
        "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
        "SWITCHBOARD_LANE_LEASE_S": "2",
        "SWITCHBOARD_SWEEP_INTERVAL_S": "0.5",
        "SWITCHBOARD_LOG_LEVEL": "WARNING",
    }

    def start(*args: str) -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"{args[0]}-{len(procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "switchboard", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wait_status(svc: Services, run_id: str, wanted: set[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        rec = svc.store.runs.get(run_id)
        if rec is not None and rec.status in wanted:
            return rec.status
        assert time.monotonic() < deadline, f"run stayed {rec.status if rec else None}"
        time.sleep(0.05)


def test_run_completes_exactly_once_after_its_worker_is_killed(
    spawn: object, services: Services
) -> None:
    """kill -9 mid-run; the sweep requeues it and a new worker writes it exactly once."""
    first = spawn("worker", "--concurrency", "4")  # type: ignore[operator]
    accepted = start_run(
        services, RunRequest(session_key="agent:main:main", message="/sleep 3\nsurvivor")
    )
    run_id = accepted["runId"]
    _wait_status(services, run_id, {"running"}, 30)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    spawn("worker", "--concurrency", "4")  # type: ignore[operator]
    spawn("beat")  # type: ignore[operator]
    assert _wait_status(services, run_id, {"ok", "error", "timeout"}, 60) == "ok"
    rec = services.store.runs.get(run_id)
    assert rec is not None and rec.reply == "survivor" and rec.attempt == 2
    transcript = services.store.transcripts.all("agent:main:main")
    assert [m["role"] for m in transcript] == ["user", "assistant"]
    assert [m["__openclaw"]["seq"] for m in transcript] == [1, 2]
    assert services.store.runs.lane_holder("agent:main:main") is None
