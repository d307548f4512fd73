"""Stopping the product's processes that a test started, each in its own process group."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence


def stop_groups(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 20) -> None:
    """SIGTERM every process group still running, wait ``timeout_s`` for each, then SIGKILL
    what is left. The processes must have been started with ``start_new_session=True``."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout_s / 2)
