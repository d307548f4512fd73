"""A call to an MCP tool in flight when its worker is killed (kill -9): the run's next
attempt repeats it with the same idempotency key in the MCP request's `_meta`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services

pytestmark = [pytest.mark.integration, pytest.mark.faults]

SERVER = Path(__file__).resolve().parents[2] / "examples" / "mcp" / "notes_server.py"


def _calls(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def _wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_call_in_flight_is_repeated_with_its_idempotency_key(
    switchboard_procs: Callable[..., subprocess.Popen[bytes]],
    services: Services,
    tmp_path: Path,
) -> None:
    """kill -9 mid-call; the retried run calls again and the server sees the same key."""
    log = tmp_path / "calls.jsonl"
    server = {"command": sys.executable, "args": [str(SERVER)], "env": {"NOTES_CALL_LOG": str(log)}}
    config = tmp_path / "switchboard.json"
    config.write_text(json.dumps({"mcp": {"servers": {"notes": server}}}))
    switchboard_procs.env["SWITCHBOARD_CONFIG"] = str(config)  # type: ignore[attr-defined]
    first = switchboard_procs("worker", "--concurrency", "4")
    message = '/tool notes__slow {"seconds": 3}'
    accepted = start_run(services, RunRequest(session_key="agent:main:main", message=message))
    _wait(lambda: len(_calls(log)) == 1, 60, "the call never reached the server")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    switchboard_procs("worker", "--concurrency", "4")
    switchboard_procs("beat")
    run_id = accepted["runId"]

    def ended() -> bool:
        rec = services.store.runs.get(run_id)
        return rec is not None and rec.status in {"ok", "error", "timeout", "lost"}

    _wait(ended, 90, "the run did not end after its worker was killed")
    rec = services.store.runs.get(run_id)
    assert rec is not None and rec.status == "ok" and rec.attempt == 2
    first_call, second_call = _calls(log)
    assert first_call["key"] == second_call["key"] and str(first_call["key"]).startswith(run_id)
    assert first_call["pid"] != second_call["pid"]  # the new worker's own server process
