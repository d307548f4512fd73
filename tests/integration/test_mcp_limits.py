"""`mcp.servers.<name>.maxConcurrent` over the real stack: two worker processes, the api,
Redis, and an MCP server written with the `mcp` SDK (`switchboard_testkit.gauge_mcp`) that
measures the calls in flight at the server; runs call it with the echo model's `/tool`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from switchboard.shared.services import Services
from switchboard_testkit.gauge_mcp import read_log, start
from switchboard_testkit.up import free_port

pytestmark = pytest.mark.integration

CALLERS = 12
LIMIT = 3
HOLD_MS = 400


@pytest.fixture
def gauge(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The gauge MCP server over Streamable HTTP: its port and its call log."""
    port = free_port()
    log = tmp_path / "gauge.jsonl"
    proc = start(port, log)
    yield port, log
    proc.kill()
    proc.wait(10)


def _one_call(http: httpx.Client, session: str, n: int) -> dict[str, Any]:
    """One run of ``session`` calling `gauge__hold`, to its end; its outcome."""
    line = "/tool gauge__hold " + json.dumps({"ms": HOLD_MS, "id": f"c{n}"})
    params = {"sessionKey": session, "message": line}
    started = http.post("/rpc", json={"method": "agent", "params": params}).json()
    wait = {"runId": started["runId"], "timeoutMs": 60_000}
    outcome: dict[str, Any] = http.post(
        "/rpc", json={"method": "agent.wait", "params": wait}
    ).json()
    return outcome


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of a sample's values with these labels in a Prometheus text page."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_max_concurrent_holds_across_two_worker_processes(
    switchboard_procs: Any, gauge: tuple[int, Path], tmp_path: Path
) -> None:
    """`maxConcurrent: 3` with 2 workers and 12 concurrent callers: the server never sees
    more than 3 calls in flight (and more than 1); every run ends ok with its call's
    record, and the api's /metrics shows the server's calls."""
    port, log = gauge
    config = {
        "mcp": {
            "servers": {
                "gauge": {
                    "url": f"http://127.0.0.1:{port}/mcp",
                    "transport": "streamable-http",
                    "maxConcurrent": LIMIT,
                }
            }
        }
    }
    path = tmp_path / "switchboard.json"
    path.write_text(json.dumps(config))
    shared = tmp_path / "prometheus"
    shared.mkdir()
    switchboard_procs.env["SWITCHBOARD_CONFIG"] = str(path)
    switchboard_procs.env["PROMETHEUS_MULTIPROC_DIR"] = str(shared)
    second = switchboard_procs("worker", "--concurrency", "4")
    with (
        switchboard_procs.serving(beat=False, concurrency=4) as (url, _),
        httpx.Client(base_url=url, headers={"Authorization": "Bearer t"}, timeout=90) as http,
    ):
        assert second.poll() is None
        with ThreadPoolExecutor(CALLERS) as pool:
            outcomes = list(
                pool.map(lambda n: _one_call(http, f"agent:main:caller{n}", n), range(CALLERS))
            )
        page = http.get("/metrics").text
        history = http.post(
            "/tools/invoke",
            json={
                "tool": "sessions_history",
                "args": {"sessionKey": "agent:main:caller0", "includeTools": True},
            },
        ).json()["result"]
    assert [o["status"] for o in outcomes] == ["ok"] * CALLERS, outcomes
    calls = read_log(log)
    assert sorted(c["id"] for c in calls) == sorted(f"c{n}" for n in range(CALLERS))
    peak = max(c["inFlight"] for c in calls)
    assert 1 < peak <= LIMIT, calls
    [record] = [m["call"] for m in history["messages"] if m["role"] == "toolResult"]
    assert (record["server"], record["tool"], record["outcome"]) == ("gauge", "hold", "ok")
    assert record["durationMs"] >= HOLD_MS and record["slotWaitMs"] >= 0
    assert _metric(page, "switchboard_tool_calls_total", server="gauge") == CALLERS
    assert _metric(page, "switchboard_tool_call_duration_seconds_count", server="gauge") == CALLERS
    assert _metric(page, "switchboard_tool_calls_in_flight", server="gauge") == 0


@pytest.fixture
def config_data(gauge: tuple[int, Path]) -> dict[str, Any]:
    """The gauge server at one slot, a call waiting for it at most requestTimeoutMs."""
    port, _ = gauge
    server = {
        "url": f"http://127.0.0.1:{port}/mcp",
        "transport": "streamable-http",
        "maxConcurrent": 1,
        "requestTimeoutMs": 800,
    }
    return {"mcp": {"servers": {"gauge": server}}}


def test_a_slot_wait_past_its_limit_is_a_tool_error_and_the_run_goes_on(
    worker: Any, services: Services, rpc: Callable[..., Any], client: httpx.Client
) -> None:
    """With the server's one slot held elsewhere, a call waits requestTimeoutMs and the
    model reads a tool error (outcome `no_slot`); the run ends ok and the slot is free."""
    services.store.tool_slots.acquire("gauge", "elsewhere", 1, 30_000)
    line = "/tool gauge__hold " + json.dumps({"ms": 10})
    started = rpc("agent", sessionKey="agent:main:main", message=line)
    outcome = rpc("agent.wait", runId=started["runId"], timeoutMs=30_000)
    assert outcome["status"] == "ok", outcome
    assert "busy" in json.loads(outcome["reply"])["error"]
    services.store.tool_slots.release("gauge", "elsewhere")
    args = {"sessionKey": "agent:main:main", "includeTools": True}
    history = client.post("/tools/invoke", json={"tool": "sessions_history", "args": args})
    [result] = [m for m in history.json()["result"]["messages"] if m["role"] == "toolResult"]
    assert result["call"]["outcome"] == "no_slot" and result["isError"] is True
    assert result["call"]["durationMs"] >= 800
    assert services.store.tool_slots.held("gauge") == 0
