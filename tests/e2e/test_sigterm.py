"""A test run stopped with SIGTERM (a CI job's timeout, a ``kill``) stops the private
redis-servers its tests started, as Ctrl-C does, instead of leaving them running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("sigterm_probe.py")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(FileNotFoundError):  # an unreaped child is gone already
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return False
    return True


def test_sigterm_stops_the_runs_private_redis_server(tmp_path: Path) -> None:
    pid_file = tmp_path / "redis.pid"
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PROBE)],
        cwd=ROOT,
        env={**os.environ, "SIGTERM_PROBE_PID_FILE": str(pid_file)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    server_pid = None
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert run.poll() is None, run.communicate()[0].decode()
            assert time.monotonic() < deadline, "the probe never started its redis-server"
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        assert _alive(server_pid)
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=30)[0].decode()
        assert run.returncode != 0, output  # interrupted, not passed
        deadline = time.monotonic() + 10
        while _alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid), f"redis-server {server_pid} left running:\n{output}"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if server_pid is not None and _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
