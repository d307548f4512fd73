"""`mcp.servers.<name>.maxConcurrent` over real workers: two worker processes, one
Streamable HTTP server written with the `mcp` SDK (`examples/mcp/notes_server.py`), and
12 runs calling its slow tool at once. Measured at the server: never more than 3 calls in
flight, and more than 1; every run ends ok, and the workers' /metrics count the calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from test_mcp_tools import SERVER, wait_port

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
from switchboard_testkit.up import free_port

pytestmark = pytest.mark.integration

CALL_S = 0.4


@pytest.fixture
def notes_http(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The notes server over Streamable HTTP on a free port, and its call log."""
    log = tmp_path / "calls.jsonl"
    port = free_port()
    env = {**os.environ, "NOTES_CALL_LOG": str(log)}
    args = [sys.executable, str(SERVER), "--http", str(port)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    yield port, log
    proc.kill()
    proc.wait(10)


def _most_at_once(log: Path) -> int:
    """The most `slow` calls the server had under way at once (each from its start for
    the seconds it sleeps)."""
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    spans = [(c["at"], c["at"] + c["arguments"]["seconds"]) for c in calls if c["tool"] == "slow"]
    return max(sum(s <= start < e for s, e in spans) for start, _ in spans)


def _wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_max_concurrent_holds_across_two_workers(
    switchboard_procs: Callable[..., subprocess.Popen[bytes]],
    services: Services,
    notes_http: tuple[int, Path],
    tmp_path: Path,
) -> None:
    """12 runs on 2 workers call a server capped at 3: at most 3 at the server, more than
    1; all 12 runs end ok with the tool's answer; the workers count 12 calls."""
    port, log = notes_http
    server = {
        "url": f"http://127.0.0.1:{port}/mcp",
        "transport": "streamable-http",
        "maxConcurrent": 3,
    }
    config = tmp_path / "switchboard.json"
    config.write_text(json.dumps({"mcp": {"servers": {"web": server}}}))
    switchboard_procs.env["SWITCHBOARD_CONFIG"] = str(config)  # type: ignore[attr-defined]
    metrics_ports = [free_port(), free_port()]
    for metrics_port in metrics_ports:
        switchboard_procs.env["SWITCHBOARD_METRICS_PORT"] = str(metrics_port)  # type: ignore[attr-defined]
        switchboard_procs("worker", "--concurrency", "8")
    message = f'/tool web__slow {{"seconds": {CALL_S}}}'
    run_ids = [
        start_run(services, RunRequest(session_key=f"agent:main:hook:cap{i}", message=message))[
            "runId"
        ]
        for i in range(12)
    ]

    def all_ended() -> bool:
        recs = [services.store.runs.get(r) for r in run_ids]
        return all(rec is not None and rec.status in {"ok", "error", "timeout"} for rec in recs)

    _wait(all_ended, 120, "the runs did not end")
    recs = [services.store.runs.get(r) for r in run_ids]
    assert [rec.status if rec else None for rec in recs] == ["ok"] * 12
    assert all(rec and f"slept {CALL_S}" in (rec.reply or "") for rec in recs)
    most = _most_at_once(log)
    assert 1 < most <= 3, f"{most} calls at once at the server"
    assert services.store.tool_slots.held("web") == 0
    counted = 0.0
    for metrics_port in metrics_ports:
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith('switchboard_tool_calls_total{server="web"}'):
                counted += float(line.rpartition(" ")[2])
    assert counted == 12
