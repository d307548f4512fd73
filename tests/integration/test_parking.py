"""Parked runs: a tool call that waits for another run ends the run and resumes it later."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from switchboard.shared.services import Services
from switchboard.shared.store.runs import RunRecord
from switchboard.shared.tools.registry import ToolContext, ToolSpec, WaitFor

pytestmark = pytest.mark.integration


def _wait_handler(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    raise WaitFor(args["runId"], float(args.get("timeoutSeconds", 30)), {"runId": args["runId"]})


def _complete(
    ctx: ToolContext, context: Mapping[str, Any], target: RunRecord | None
) -> dict[str, Any]:
    if target is None:
        return {"status": "error", "error": "no such run"}
    if not target.terminal:
        return {"status": "timeout", "runId": target.run_id}
    return {"status": target.status, "runId": target.run_id, "reply": target.reply}


@pytest.fixture
def wait_tool(services: Services) -> ToolSpec:
    """A tool that waits for a run (the mechanism sessions_send uses)."""
    return services.tools.register(
        ToolSpec(
            name="wait_for_run",
            description="Wait for a run to end and return its reply.",
            parameters={
                "type": "object",
                "properties": {"runId": {"type": "string"}, "timeoutSeconds": {"type": "number"}},
                "required": ["runId"],
            },
            handler=_wait_handler,
            complete=_complete,
        )
    )


def _tool_line(run_id: str, timeout_s: float = 30) -> str:
    return "/tool wait_for_run " + json.dumps({"runId": run_id, "timeoutSeconds": timeout_s})


def test_waiting_tool_call_parks_and_resumes_with_the_result(
    worker: Any, rpc: Callable[..., Any], services: Services, wait_tool: ToolSpec
) -> None:
    """The caller's run parks (no slot held) and resumes with the target's reply."""
    target = rpc("agent", sessionKey="hook:target", message="/sleep 1.5\ntarget says hi")
    caller = rpc("agent", sessionKey="main", message=_tool_line(target["runId"]))
    deadline = time.monotonic() + 10
    while services.store.runs.get(caller["runId"]).status != "parked":  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the caller never parked"
        time.sleep(0.05)
    outcome = rpc("agent.wait", runId=caller["runId"], timeoutMs=20_000)
    assert outcome["status"] == "ok"
    assert json.loads(outcome["reply"]) == {
        "status": "ok",
        "runId": target["runId"],
        "reply": "target says hi",
    }
    roles = [m["role"] for m in rpc("chat.history", sessionKey="main")["messages"]]
    assert roles == ["user", "assistant", "toolResult", "assistant"]


def test_parked_waiters_hold_no_worker_slots(
    worker: Any, rpc: Callable[..., Any], services: Services, wait_tool: ToolSpec
) -> None:
    """30 runs wait at once on a worker with 16 threads, and all complete."""
    blocker = rpc("agent", sessionKey="hook:busy", message="/sleep 2\nblocker")
    target = rpc("agent", sessionKey="hook:busy", message="the target")
    callers = [
        rpc("agent", sessionKey=f"hook:caller-{i}", message=_tool_line(target["runId"]))
        for i in range(30)
    ]
    deadline = time.monotonic() + 15
    while True:
        parked = [services.store.runs.get(c["runId"]) for c in callers]
        if all(r is not None and r.status == "parked" for r in parked):
            break
        assert time.monotonic() < deadline, "not every caller parked"
        time.sleep(0.05)
    assert services.store.runs.get(target["runId"]).status == "queued"  # type: ignore[union-attr]
    outcomes = [rpc("agent.wait", runId=c["runId"], timeoutMs=30_000) for c in callers]
    assert {o["status"] for o in outcomes} == {"ok"}
    assert {json.loads(o["reply"])["reply"] for o in outcomes} == {"the target"}
    assert rpc("agent.wait", runId=blocker["runId"], timeoutMs=1000)["status"] == "ok"


def test_parked_run_resumes_with_a_timeout_when_the_wait_deadline_passes(
    worker: Any, sweeper: None, rpc: Callable[..., Any], wait_tool: ToolSpec
) -> None:
    """The sweep resumes a parked run whose wait is overdue; the target keeps running."""
    target = rpc("agent", sessionKey="hook:slow", message="/sleep 4\nlate answer")
    caller = rpc("agent", sessionKey="main", message=_tool_line(target["runId"], 1))
    outcome = rpc("agent.wait", runId=caller["runId"], timeoutMs=20_000)
    assert outcome["status"] == "ok"
    assert json.loads(outcome["reply"])["status"] == "timeout"
    late = rpc("agent.wait", runId=target["runId"], timeoutMs=20_000)
    assert late == {**late, "status": "ok", "reply": "late answer"}


def test_wait_on_an_already_finished_run_resumes_at_once(
    worker: Any, rpc: Callable[..., Any], wait_tool: ToolSpec
) -> None:
    """A target that already ended makes the park step answer 'ready' and resume now."""
    target = rpc("agent", sessionKey="hook:quick", message="quick")
    assert rpc("agent.wait", runId=target["runId"], timeoutMs=10_000)["status"] == "ok"
    caller = rpc("agent", sessionKey="main", message=_tool_line(target["runId"]))
    outcome = rpc("agent.wait", runId=caller["runId"], timeoutMs=10_000)
    assert json.loads(outcome["reply"])["reply"] == "quick"
