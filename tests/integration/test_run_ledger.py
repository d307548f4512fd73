"""The run ledger: `lost` and `cancelled` are terminal states like the others, for the
runs themselves, their waiters, their requesters' announces and /metrics; real Redis, a
real worker, the real api."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from switchboard.api.tools import tool_context
from switchboard.shared.runtime.cancel_signal import CancelSignal, RunCancelled
from switchboard.shared.runtime.executor import LOST_TEXT
from switchboard.shared.services import Services
from switchboard.shared.store.run_records import LEDGER_TERMINAL, TERMINAL, ledger_state
from switchboard_testkit.calls import wait_until

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"


@pytest.fixture
def config_data() -> dict[str, Any]:
    """One attempt per run: the first worker loss leaves no retry."""
    return {"runs": {"maxAttempts": 1}}


def invoke(client: httpx.Client, tool: str, session: str = "main", **args: Any) -> dict[str, Any]:
    """A tool call over /tools/invoke acting for ``session``; the tool's result."""
    resp = client.post("/tools/invoke", json={"tool": tool, "args": args, "sessionKey": session})
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def announces(services: Services, key: str = MAIN) -> list[dict[str, Any]]:
    """The sub-agent announces in a session's transcript."""
    return [
        m
        for m in services.store.transcripts.all(key)
        if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
    ]


def terminal_by_state(client: httpx.Client) -> dict[str, float]:
    """`switchboard_runs_terminal_total` by state, scraped from /metrics."""
    resp = client.get("/metrics")
    assert resp.status_code == 200, resp.text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            if sample.name == "switchboard_runs_terminal_total":
                out[sample.labels["state"]] = sample.value
    return out


def test_every_stored_status_has_a_ledger_state() -> None:
    """ok/error/timeout read as succeeded/failed/timed_out; cancelled and lost are terminal."""
    assert {ledger_state(s) for s in TERMINAL} == set(LEDGER_TERMINAL)
    assert [ledger_state(s) for s in ("queued", "running", "parked")] == [
        "queued",
        "running",
        "running",
    ]
    assert {"cancelled", "lost"} <= TERMINAL


def test_a_run_whose_worker_loss_used_up_its_attempts_is_lost_and_its_parent_is_told(
    client: httpx.Client,
    rpc: Callable[..., Any],
    services: Services,
    request: pytest.FixtureRequest,
) -> None:
    """A worker claims a child's run and vanishes (no lease renewed); with no attempt left,
    the next claim ends it `lost` instead of running it; the parent gets its announce, and
    the ledger shows `lost` in the run, `subagents`, agent.wait and /metrics."""
    spawned = invoke(client, "sessions_spawn", task="go\n/reply never produced", label="doomed")
    assert spawned["status"] == "accepted", spawned
    run_id, child = spawned["runId"], spawned["childSessionKey"]
    # No worker runs yet: this claim is the worker that took the run, then died.
    claim = services.store.runs.claim(run_id, child)
    assert not isinstance(claim, str) and claim.attempt == 1
    request.getfixturevalue("worker")
    request.getfixturevalue("sweeper")
    rec = wait_until(
        lambda: (r := services.store.runs.get(run_id)) is not None and r.terminal and r,
        "the run to end",
    )
    assert (rec.status, rec.state, rec.error) == ("lost", "lost", LOST_TEXT)
    assert rec.ended_at_ms is not None and rec.reply is None
    [told] = wait_until(lambda: announces(services), "the parent's announce")
    assert "Status: lost" in told["content"] and "doomed" in told["content"]
    assert LOST_TEXT in told["content"]
    [row] = invoke(client, "subagents")["recent"]
    assert (row["runId"], row["state"], row["status"]) == (run_id, "lost", "failed")
    assert row["outcome"] == {"status": "lost", "error": LOST_TEXT}
    assert rpc("agent.wait", runId=run_id, timeoutMs=1000)["status"] == "lost"
    assert terminal_by_state(client)["lost"] == 1
    assert services.store.transcripts.all(child)[-1]["role"] == "user"  # never ran


def test_a_cancelled_run_ends_every_wait_on_it_and_is_counted(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """agent.wait on a running child answers `cancelled` as soon as it is cancelled (not at
    its timeout); /metrics counts the run by its ledger state."""
    before = terminal_by_state(client)
    assert set(LEDGER_TERMINAL) <= set(before)  # every state is exported, 0 or not
    spawned = invoke(client, "sessions_spawn", task="go\n/sleep 60")
    run_id = spawned["runId"]
    wait_until(lambda: services.store.runs.status(run_id) == "running", "the child to run")
    answers: list[dict[str, Any]] = []
    waiter = threading.Thread(
        target=lambda: answers.append(rpc("agent.wait", runId=run_id, timeoutMs=30_000))
    )
    waiter.start()
    time.sleep(0.3)
    started = time.monotonic()
    assert invoke(client, "subagents", action="cancel", runId=run_id)["cancelled"] is True
    waiter.join(20)
    assert answers and answers[0]["status"] == "cancelled", answers
    assert time.monotonic() - started < 10
    after = terminal_by_state(client)
    assert after["cancelled"] == before["cancelled"] + 1
    entry = services.store.sessions.get(spawned["childSessionKey"])
    assert entry is not None and entry.get("status") == "cancelled"
    assert entry.get("abortedLastRun") is True


def test_a_cancel_signal_stops_the_work_but_not_a_deadline() -> None:
    """The signal cancels the awaited work (from another thread) and says so; the
    caller's own cancellation (its deadline) is not mistaken for it."""

    async def stopped() -> None:
        signal = CancelSignal()
        threading.Timer(0.05, signal.fire).start()
        with pytest.raises(RunCancelled):
            await signal.run(asyncio.sleep(30))

    async def deadline() -> None:
        signal = CancelSignal()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await signal.run(asyncio.sleep(30))

    async def fired_before() -> None:
        signal = CancelSignal()
        signal.fire()
        with pytest.raises(RunCancelled):
            await signal.run(asyncio.sleep(30))

    for case in (stopped, deadline, fired_before):
        asyncio.run(asyncio.wait_for(case(), 5))


@pytest.fixture
def processes(switchboard_procs: Any, tmp_path: Path, config_data: dict[str, Any]) -> Any:
    """`switchboard <command>` subprocesses on this test's Redis and config."""
    config_file = tmp_path / "switchboard.json"
    config_file.write_text(json.dumps(config_data), encoding="utf-8")
    switchboard_procs.env["SWITCHBOARD_CONFIG"] = str(config_file)
    return switchboard_procs


@pytest.mark.faults
def test_kill_9_of_the_worker_with_no_retry_left_ends_the_child_lost(
    processes: Any, services: Services
) -> None:
    """kill -9 of the worker executing a child run, with one attempt per run: a new worker
    and beat end the run `lost` (never `running` forever) and its parent hears of it."""
    first = processes("worker", "--concurrency", "4")
    spec = services.tools.get("sessions_spawn")
    assert spec is not None
    ctx = tool_context(services, "main")
    accepted = spec.handler(ctx, {"task": "go\n/sleep 30\n/reply never", "label": "killed"})
    assert accepted["status"] == "accepted", accepted
    run_id = accepted["runId"]
    wait_until(lambda: services.store.runs.status(run_id) == "running", "the child to run", 60)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    processes("worker", "--concurrency", "4")
    processes("beat")
    wait_until(lambda: services.store.runs.status(run_id) == "lost", "the child to be lost", 60)
    [told] = wait_until(lambda: announces(services), "the parent's announce", 60)
    assert "Status: lost" in told["content"] and "killed" in told["content"]
