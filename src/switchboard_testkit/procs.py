"""The product's processes that a test started, each in its own process group: waiting
for an api to answer, a send through it, and stopping them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import httpx


def wait_healthy(
    url: str, procs: Sequence[subprocess.Popen[bytes]] = (), timeout_s: float = 30
) -> None:
    """Return once the api at ``url`` answers ``/healthz`` 200; fail (AssertionError) when
    one of ``procs`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        exited = [proc.args for proc in procs if proc.poll() is not None]
        assert not exited, f"exited while the api started: {exited}"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        assert time.monotonic() < deadline, f"{url} did not answer /healthz in {timeout_s:g}s"
        time.sleep(0.1)


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


def send_and_wait(
    url: str, session_key: str, message: str, *, token: str = "t", timeout_s: float = 30
) -> dict[str, Any]:
    """``sessions_send`` with a wait through the api at ``url`` (``/tools/invoke``); its
    result once the call answered 200 (AssertionError with the body otherwise)."""
    args = {"sessionKey": session_key, "message": message, "timeoutSeconds": timeout_s}
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=timeout_s + 10) as http:
        resp = http.post("/tools/invoke", json={"tool": "sessions_send", "args": args})
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result
