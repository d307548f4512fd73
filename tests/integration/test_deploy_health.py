"""`switchboard check-health` per role, through the real CLI: a worker pings itself, the
beat's own heartbeat must be recent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from switchboard.cli.heartbeat import HEARTBEAT
from switchboard.shared.config import Settings
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.runs import now_ms
from switchboard.shared.store.sweeps import SweepStore
from switchboard_testkit.procs import stop_groups

pytestmark = pytest.mark.integration


@pytest.fixture
def env(redis_url: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a Switchboard process on the private Redis (sweep every 5 s)."""
    out = {
        **os.environ,
        "SWITCHBOARD_REDIS_URL": redis_url,
        "SWITCHBOARD_TOKEN": "t",
        "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
        "SWITCHBOARD_LOG_LEVEL": "WARNING",
        "SWITCHBOARD_SWEEP_INTERVAL_S": "5",
    }
    out.pop("SWITCHBOARD_CONFIG", None)
    return out


def check_health(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run `switchboard check-health <args>` as a container's healthcheck would."""
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "check-health", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def worker_proc(env: dict[str, str], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A `switchboard worker` subprocess (default node name, celery@<hostname>)."""
    with (tmp_path / "worker.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "switchboard", "worker", "--concurrency", "2"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop_groups([proc], timeout_s=20)


def test_worker_check_pings_this_hosts_worker(
    env: dict[str, str], worker_proc: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """`--worker` passes once the local worker answers its ping; another node's name fails."""
    deadline = time.monotonic() + 60
    while (result := check_health(env, "--worker")).returncode != 0:
        assert worker_proc.poll() is None, (tmp_path / "worker.log").read_text()
        assert time.monotonic() < deadline, result.stderr
        time.sleep(1)
    assert result.stdout.strip() == "healthy"
    absent = check_health(env, "--worker", "--node", "celery@no-such-host")
    assert absent.returncode == 3
    assert "celery@no-such-host" in absent.stderr and "no reply" in absent.stderr
    default = f"celery@{socket.gethostname()}"
    stop_groups([worker_proc], timeout_s=20)
    gone = check_health(env, "--worker")
    assert gone.returncode == 3 and default in gone.stderr


def test_beat_check_reads_the_heartbeat_mark(env: dict[str, str], redis_url: str) -> None:
    """`--beat` fails with no heartbeat or one older than 6 intervals, passes on a fresh one;
    the sweep's own mark does not stand in for it."""
    never = check_health(env, "--beat")
    assert never.returncode == 3 and "no heartbeat" in never.stderr
    with redis.Redis.from_url(redis_url) as client:
        marks = SweepStore(client, Keyspace("sb:", Settings().groups))
        marks.mark_ran("sweep", now_ms())
        assert check_health(env, "--beat").returncode == 3
        marks.mark_ran(HEARTBEAT, now_ms() - 31_000)
        stale = check_health(env, "--beat")
        assert stale.returncode == 3 and "limit 30s" in stale.stderr
        marks.mark_ran(HEARTBEAT, now_ms() - 20_000)
        fresh = check_health(env, "--beat")
    assert fresh.returncode == 0, fresh.stderr


def test_a_running_beat_is_healthy_without_any_worker_and_a_stuck_one_is_not(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A real `switchboard beat` passes `--beat` with no worker running its sweeps (its
    heartbeat is its own); paused (SIGSTOP, a hung loop) it fails within the limit."""
    env["SWITCHBOARD_SWEEP_INTERVAL_S"] = "1"  # limit: 6 s
    with (tmp_path / "beat.log").open("wb") as out:
        beat = subprocess.Popen(
            [sys.executable, "-m", "switchboard", "beat"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while (result := check_health(env, "--beat")).returncode != 0:
            assert beat.poll() is None, (tmp_path / "beat.log").read_text()
            assert time.monotonic() < deadline, result.stderr
            time.sleep(0.5)
        os.killpg(beat.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 30
            while (result := check_health(env, "--beat")).returncode == 0:
                assert time.monotonic() < deadline, "a paused beat stayed healthy"
                time.sleep(0.5)
            assert result.returncode == 3 and "heartbeat" in result.stderr, result.stderr
        finally:
            os.killpg(beat.pid, signal.SIGCONT)
    finally:
        stop_groups([beat], timeout_s=20)


def test_default_check_still_pings_only_redis(env: dict[str, str]) -> None:
    """Without a role flag check-health stays what it was: Redis answers, exit 0."""
    result = check_health(env)
    assert result.returncode == 0, result.stderr
    env["SWITCHBOARD_REDIS_URL"] = "redis://127.0.0.1:1/0"
    down = check_health(env, "--beat")
    assert down.returncode == 3 and "redis:" in down.stderr


def test_two_workers_on_one_host_run_under_their_own_node_names(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`switchboard worker --node` names each worker; both answer pings under their names
    (without it, two workers on one host share celery@<host> and collide on RabbitMQ)."""
    host = socket.gethostname()
    procs = []
    for name in ("w1", "w2"):
        with (tmp_path / f"{name}.log").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "switchboard",
                        "worker",
                        "--concurrency",
                        "2",
                        "--node",
                        f"{name}@%h",
                    ],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    try:
        for name, proc in zip(("w1", "w2"), procs, strict=True):
            deadline = time.monotonic() + 60
            while (result := check_health(env, "--worker", "--node", f"{name}@{host}")).returncode:
                assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()
                assert time.monotonic() < deadline, result.stderr
                time.sleep(1)
        # Neither took the default name.
        assert check_health(env, "--worker", "--node", f"celery@{host}").returncode == 3
    finally:
        stop_groups(procs, timeout_s=20)
