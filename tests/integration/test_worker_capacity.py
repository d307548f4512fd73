"""One worker process keeps at least 100 slow model calls in flight at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services

pytestmark = pytest.mark.integration


def test_one_worker_process_runs_100_slow_calls_concurrently(
    redis_url: str, services: Services, tmp_path: Path
) -> None:
    """100 runs that each take 3 s all overlap on a single `switchboard worker` process."""
    env = {**os.environ, "SWITCHBOARD_REDIS_URL": redis_url, "SWITCHBOARD_LOG_LEVEL": "WARNING"}
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "worker", "--concurrency", "128"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        run_ids = [
            start_run(
                services, RunRequest(session_key=f"agent:main:hook:c{i}", message="/sleep 3\nok")
            )["runId"]
            for i in range(100)
        ]
        deadline = time.monotonic() + 60
        while True:
            records = services.store.runs.get_many(run_ids)
            if all(r is not None and r.terminal for r in records):
                break
            assert time.monotonic() < deadline, "runs did not finish"
            time.sleep(0.2)
        assert {r.status for r in records if r} == {"ok"}
        latest_start = max(r.started_at_ms or 0 for r in records if r)
        earliest_end = min(r.ended_at_ms or 0 for r in records if r)
        assert latest_start < earliest_end, "not all 100 calls were in flight at once"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
