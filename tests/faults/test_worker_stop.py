"""SIGTERM of a worker with slow runs in flight (a rollout, a scale-down): it hands them
back and exits within its 60 s grace; a second worker finishes every run exactly once.

No beat runs and the lane lease is long (60 s), so the runs cannot be recovered by the
sweep within the test's time: only the stopping worker's hand-back gets them done.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from faultkit import Cluster, assert_transcripts_exact, count_by, wait_until

from switchboard.shared.gateway.agent import RunRequest, start_run

pytestmark = pytest.mark.faults

SESSIONS = 12
MAX_IN_FLIGHT = 8  # the first worker's limit: it runs 8 of the 12, the rest stay queued
RUN_SLEEP_S = 10
GRACE_S = 60  # docker-compose.yml stop_grace_period, worker.yaml terminationGracePeriodSeconds


def test_sigterm_hands_runs_back_and_a_second_worker_finishes_each_once(
    cluster: Cluster,
) -> None:
    """The stopped worker exits 0 in seconds; every run ends ok once, transcripts exact."""
    cluster.env_extra["SWITCHBOARD_LANE_LEASE_S"] = "60"
    cluster.env_extra["SWITCHBOARD_WORKER_MAX_IN_FLIGHT"] = str(MAX_IN_FLIGHT)
    first = cluster.worker()
    ids = [
        start_run(
            cluster.services,
            RunRequest(
                session_key=f"agent:main:hook:slow-{i}", message=f"/sleep {RUN_SLEEP_S}\nslow {i}"
            ),
        )["runId"]
        for i in range(SESSIONS)
    ]

    def running() -> int | None:
        count = sum(r.status == "running" for r in cluster.runs())
        return count if count >= MAX_IN_FLIGHT else None

    wait_until(running, 30, "the first worker to run its share", 0.1)
    os.killpg(first.popen.pid, signal.SIGTERM)
    stopped_at = time.monotonic()
    first.popen.wait(GRACE_S)
    took_s = time.monotonic() - stopped_at
    print(f"\nworker stopped {took_s:.1f}s after SIGTERM")
    assert first.popen.returncode == 0, first.output()[-3000:]
    assert took_s < RUN_SLEEP_S, "the worker waited for its runs instead of handing them back"
    assert f"{MAX_IN_FLIGHT} run(s) handed back" in first.output()
    assert not any(r.status == "running" for r in cluster.runs()), count_by(
        r.status for r in cluster.runs()
    )

    cluster.worker()

    def settled() -> bool:
        return all(r.terminal for r in cluster.runs())

    wait_until(settled, 45, "the second worker to finish every run", 0.5, cluster.runs)
    runs = cluster.runs()
    assert sorted(r.run_id for r in runs) == sorted(ids)
    outcome = count_by((r.status, r.attempt) for r in runs)
    assert outcome == {("ok", 2): MAX_IN_FLIGHT, ("ok", 1): SESSIONS - MAX_IN_FLIGHT}, outcome
    assert assert_transcripts_exact(cluster, runs) == 2 * SESSIONS
