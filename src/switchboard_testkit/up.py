"""`switchboard up` started as a user starts it, in a directory of its own (for e2e tests)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    """A port nobody listens on right now (loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """The environment without SWITCHBOARD_* settings, as on a newcomer's machine."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}


@dataclass
class UpProcess:
    """A running `switchboard up`: its process, api URL, token, directory and output."""

    proc: subprocess.Popen[str]
    url: str
    token: str
    workdir: Path
    lines: list[str] = field(default_factory=list)


@contextlib.contextmanager
def start_up(
    workdir: Path,
    config: dict[str, Any],
    *,
    concurrency: int = 16,
    timeout_s: float = 60,
    args: Sequence[str] = (),
) -> Iterator[UpProcess]:
    """Start `switchboard up --config switchboard.json5 [args]` in workdir; SIGINT it on
    exit."""
    (workdir / "switchboard.json5").write_text(json.dumps(config))
    port = free_port()
    command = [sys.executable, "-m", "switchboard", "up", "--config", "switchboard.json5"]
    proc = subprocess.Popen(
        [*command, "--port", str(port), "--concurrency", str(concurrency), *args],
        cwd=workdir,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    token = ""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not token:
        line = proc.stdout.readline()
        lines.append(line)
        if match := re.match(r"token (\S+)", line.strip()):
            token = match.group(1)
        assert proc.poll() is None, "".join(lines)
    assert token, "up never printed a token:\n" + "".join(lines)
    # Drain the output so the children never block on a full pipe.
    stdout = proc.stdout
    threading.Thread(target=lambda: lines.extend(stdout), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    else:
        raise AssertionError("the api never became healthy:\n" + "".join(lines))
    try:
        yield UpProcess(proc, url, token, workdir, lines)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
