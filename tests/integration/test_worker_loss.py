"""Worker loss: a run whose worker is killed mid-run completes exactly once on a new worker."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

import pytest

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def _wait_status(svc: Services, run_id: str, wanted: set[str], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        rec = svc.store.runs.get(run_id)
        if rec is not None and rec.status in wanted:
            return rec.status
        assert time.monotonic() < deadline, f"run stayed {rec.status if rec else None}"
        time.sleep(0.05)


def test_run_completes_exactly_once_after_its_worker_is_killed(
    switchboard_procs: Callable[..., subprocess.Popen[bytes]], services: Services
) -> None:
    """kill -9 mid-run; the sweep requeues it and a new worker writes it exactly once."""
    first = switchboard_procs("worker", "--concurrency", "4")
    accepted = start_run(
        services, RunRequest(session_key="agent:main:main", message="/sleep 3\nsurvivor")
    )
    run_id = accepted["runId"]
    _wait_status(services, run_id, {"running"}, 30)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    switchboard_procs("worker", "--concurrency", "4")
    switchboard_procs("beat")
    assert _wait_status(services, run_id, {"ok", "error", "timeout"}, 60) == "ok"
    rec = services.store.runs.get(run_id)
    assert rec is not None and rec.reply == "survivor" and rec.attempt == 2
    transcript = services.store.transcripts.all("agent:main:main")
    assert [m["role"] for m in transcript] == ["user", "assistant"]
    assert [m["__openclaw"]["seq"] for m in transcript] == [1, 2]
    assert services.store.runs.lane_holder("agent:main:main") is None
