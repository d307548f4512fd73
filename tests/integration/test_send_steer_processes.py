"""Steering across processes: the `sessions_send` call lands on an api process, the run it
steers executes on a worker process, and a worker killed with -9 while a steered message
waits (before its next step takes it, or after, before the run's end writes it) loses
nothing: the run's next attempt on a new worker takes the message and answers it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from switchboard.shared.services import Services
from switchboard.shared.store.runs import RunRecord
from switchboard_testkit.procs import wait_healthy

pytestmark = pytest.mark.integration

TARGET = "agent:main:hook:steered"


def wait_until(check: Callable[[], Any], timeout_s: float = 30, what: str = "condition") -> Any:
    """Poll until `check()` is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def invoke(url: str, **args: Any) -> dict[str, Any]:
    """`sessions_send` through the api process at ``url``."""
    headers = {"Authorization": "Bearer t"}
    body = {"tool": "sessions_send", "args": args}
    resp = httpx.post(f"{url}/tools/invoke", json=body, headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def ended(services: Services, run_id: str, timeout_s: float = 60) -> RunRecord:
    """The run once it has ended."""

    def check() -> RunRecord | None:
        rec = services.store.runs.get(run_id)
        return rec if rec is not None and rec.terminal else None

    found: RunRecord = wait_until(check, timeout_s, what=f"run {run_id} to end")
    return found


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(procs: Any) -> str:
    """An api process on a free port (the fixture's `switchboard_procs`), once it answers."""
    port = free_port()
    proc = procs("api", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, [proc])
    return url


def start_target(url: str, services: Services, message: str) -> str:
    """Start a turn of the target through the api's `agent` method (no reply-back flow);
    its run id once a worker runs it."""
    body = {"method": "agent", "params": {"sessionKey": TARGET, "message": message}}
    resp = httpx.post(f"{url}/rpc", json=body, headers={"Authorization": "Bearer t"}, timeout=30)
    assert resp.status_code == 200, resp.text
    run_id = str(resp.json()["runId"])
    wait_until(lambda: services.store.runs.status(run_id) == "running", what="the run to start")
    return run_id


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_steer_from_an_api_process_reaches_a_run_on_a_worker_process(
    switchboard_procs: Any, services: Services
) -> None:
    """The api process puts the message in the store; the worker process's run takes it
    after its tool call and answers it."""
    url = api(switchboard_procs)
    switchboard_procs("worker", "--concurrency", "2")
    run_id = start_target(url, services, "/sleep 2\n/tool agents_list {}")
    result = invoke(url, sessionKey=TARGET, message="/reply heard you", mode="steer")
    assert (result["targetDisposition"], result["runId"]) == ("steered", run_id)
    rec = ended(services, run_id)
    assert (rec.status, rec.reply, rec.attempt) == ("ok", "heard you", 1)
    roles = [m["role"] for m in services.store.transcripts.all(TARGET)]
    assert roles[-5:] == ["user", "assistant", "toolResult", "user", "assistant"]


@pytest.mark.faults
@pytest.mark.parametrize("moment", ["before_the_step", "after_the_step"])
def test_a_steered_message_survives_a_worker_killed_with_9(
    switchboard_procs: Any, services: Services, moment: str
) -> None:
    """kill -9 of the worker while the steered message waits for the run's next step (or
    once that step took it, while the model answers it): the message stays in the store,
    and the run's next attempt on a new worker answers it; it is written once."""
    url = api(switchboard_procs)
    first = switchboard_procs("worker", "--concurrency", "2")
    run_id = start_target(url, services, "/sleep 3\n/tool agents_list {}")
    # The steered answer takes 4 s on the first attempt's model (a `/sleep` in it).
    steered = invoke(url, sessionKey=TARGET, message="/sleep 4\n/reply survived", mode="steer")
    assert steered["targetDisposition"] == "steered"
    if moment == "after_the_step":
        time.sleep(4.5)  # the tool call is done (~3 s) and the step took the message
    _kill(first)
    [waiting] = services.store.steering.waiting(TARGET)  # kept until a turn writes it
    assert waiting["content"] == "/sleep 4\n/reply survived"
    switchboard_procs("worker", "--concurrency", "2")
    switchboard_procs("beat")
    rec = ended(services, run_id, timeout_s=60)
    assert (rec.status, rec.reply) == ("ok", "survived")
    assert rec.attempt == 2  # the first attempt died; the second took the message
    contents = [str(m["content"]) for m in services.store.transcripts.all(TARGET)]
    assert contents.count("/sleep 4\n/reply survived") == 1
    assert services.store.steering.waiting(TARGET) == []
    entry = services.store.sessions.get(TARGET)
    assert entry is not None and not entry.get("steerQueued")
