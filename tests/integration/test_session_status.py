"""`session_status` over the real api, Redis and worker: the card, visibility, errors.

Runs are real agent runs of the echo model (usage counts words), so the card's usage,
timing, lane and current run are what the worker recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from switchboard.shared.services import Services

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
BUSY = "agent:main:cron:busy"
OPS = "agent:ops:main"
ALL_NO_A2A = {"tools": {"sessions": {"visibility": "all"}}}
ALL_A2A_MAIN_ONLY = {
    "tools": {
        "sessions": {"visibility": "all"},
        "agentToAgent": {"enabled": True, "allow": ["main"]},
    }
}
ALL_A2A_BOTH = {
    "tools": {
        "sessions": {"visibility": "all"},
        "agentToAgent": {"enabled": True, "allow": ["main", "ops"]},
    }
}


def configured(data: dict[str, Any]) -> pytest.MarkDecorator:
    """Run the test with this JSON config (indirect parametrization of `config_data`)."""
    return pytest.mark.parametrize("config_data", [data], indirect=True)


@pytest.fixture
def config_data(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The test's config: `{}` (default visibility `agent`) unless parametrized."""
    return dict(getattr(request, "param", {}))


@pytest.fixture
def invoke(client: httpx.Client) -> Callable[..., Any]:
    """Call a tool over `POST /tools/invoke` for a session and return its result."""

    def call(tool: str, args: dict[str, Any] | None = None, session: str = "main") -> Any:
        body = {"tool": tool, "args": args or {}, "sessionKey": session}
        resp = client.post("/tools/invoke", json=body)
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert answer["ok"] is True
        return answer["result"]

    return call


def run_to_end(rpc: Callable[..., Any], session: str, message: str) -> str:
    """Start a run and wait for its (successful) end; returns its runId."""
    started = rpc("agent", sessionKey=session, message=message)
    outcome = rpc("agent.wait", runId=started["runId"], timeoutMs=20_000)
    assert outcome["status"] == "ok", outcome
    return str(started["runId"])


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll until ``check()`` holds."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_own_session_card_sums_usage_of_its_runs(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any], services: Services
) -> None:
    """Default (no sessionKey) is the caller: model, usage = the sum of its run records'
    usage, timing from the entry and the last run, an idle lane."""
    first = run_to_end(rpc, "main", "one two three")
    last = run_to_end(rpc, "main", "four five")
    records = services.store.runs.get_many([first, last])
    card = invoke("session_status")
    assert card["ok"] is True
    assert (card["sessionKey"], card["agentId"]) == ("main", "main")
    assert (card["modelProvider"], card["model"]) == ("builtin", "echo")
    assert card["changedModel"] is False and "modelNote" not in card
    usage = card["usage"]
    for ours, theirs in (("inputTokens", "input"), ("outputTokens", "output")):
        assert usage[ours] == sum(r.usage[theirs] for r in records if r) > 0
    assert usage["totalTokens"] == sum(r.usage["totalTokens"] for r in records if r)
    assert usage["contextTokens"] == records[1].usage["input"]  # type: ignore[union-attr]
    assert card["active"] is False
    assert card["queue"] == {"depth": 0}
    assert card["currentRun"] is None
    rec = records[1]
    assert rec is not None
    assert card["lastRun"] == {
        "runId": last,
        "status": "ok",
        "startedAt": rec.started_at_ms,
        "endedAt": rec.ended_at_ms,
    }
    entry = services.store.sessions.get(MAIN)
    assert entry is not None
    assert card["sessionId"] == entry.session_id
    assert card["time"] == {
        "createdAt": entry.get("createdAt"),
        "updatedAt": entry.updated_at_ms,
        "lastRunStartedAt": rec.started_at_ms,
        "lastRunEndedAt": rec.ended_at_ms,
    }
    assert f"Tokens: {usage['inputTokens']} in" in card["statusText"]
    assert f"Last run: {last} (ok)" in card["statusText"]
    for alias in ("current", "main", MAIN, entry.session_id.upper()):
        again = invoke("session_status", {"sessionKey": alias})
        assert again["sessionKey"] == "main" and again["usage"] == usage, alias


def test_a_visible_busy_session_shows_its_current_run_and_queue_depth(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any], services: Services
) -> None:
    """Another session of the caller's agent (default `agent` visibility): the run holding
    its lane and the runs queued behind it, then an idle lane once they are done."""
    slow = rpc("agent", sessionKey=BUSY, message="/sleep 2\nslow")["runId"]
    wait_until(lambda: services.store.runs.status(slow) == "running")
    queued = [rpc("agent", sessionKey=BUSY, message=f"next {i}")["runId"] for i in range(2)]
    card = invoke("session_status", {"sessionKey": BUSY})
    assert card["sessionKey"] == BUSY
    assert card["active"] is True
    assert card["currentRun"]["runId"] == slow
    assert card["currentRun"]["status"] == "running"
    assert card["queue"] == {"depth": 2}
    assert f"Current run: {slow} (running); queued behind it: 2" in card["statusText"]
    for run_id in (slow, *queued):
        assert rpc("agent.wait", runId=run_id, timeoutMs=20_000)["status"] == "ok"
    idle = invoke("session_status", {"sessionKey": BUSY})
    assert (idle["active"], idle["currentRun"], idle["queue"]) == (False, None, {"depth": 0})
    assert idle["lastRun"]["runId"] == queued[-1]


def test_the_model_argument_is_accepted_and_ignored(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """`model` (deprecated) changes nothing here and the card says so."""
    run_to_end(rpc, "main", "hello")
    for model in ("openai/gpt-5", "default"):
        card = invoke("session_status", {"model": model})
        assert card["changedModel"] is False
        assert "not supported" in card["modelNote"]
        assert card["model"] == "echo"


def test_unknown_session_keys_are_named_in_the_error(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """A visible key with no session, or a sessionId nobody has: OpenClaw's message."""
    run_to_end(rpc, "main", "hello")
    assert invoke("session_status", {"sessionKey": "agent:main:cron:ghost"}) == {
        "status": "error",
        "error": "Unknown sessionKey: agent:main:cron:ghost",
    }
    missing = "0b1f6b6e-1d7c-4a43-9b7a-3f2d4c5e6a7b"
    assert invoke("session_status", {"sessionKey": missing}) == {
        "status": "error",
        "error": f"Unknown sessionKey: {missing}",
    }


def test_another_agent_needs_visibility_all(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """Under the default `agent` visibility a cross-agent target is refused, naming the
    setting to change (and whether it exists is not told)."""
    run_to_end(rpc, OPS, "ops work")
    for target in (OPS, "agent:ops:cron:ghost"):
        assert invoke("session_status", {"sessionKey": target}) == {
            "status": "forbidden",
            "error": "Session status visibility is restricted. "
            "Set tools.sessions.visibility=all to allow cross-agent access; "
            "use tools.agentToAgent to restrict permitted agent pairs.",
        }


@configured(ALL_NO_A2A)
def test_cross_agent_status_is_disabled_without_agent_to_agent(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """Visibility `all` but tools.agentToAgent off: OpenClaw's exact message."""
    run_to_end(rpc, OPS, "ops work")
    assert invoke("session_status", {"sessionKey": OPS}) == {
        "status": "forbidden",
        "error": "Agent-to-agent status is disabled. "
        "Set tools.agentToAgent.enabled=true to allow cross-agent access.",
    }


@configured(ALL_A2A_MAIN_ONLY)
def test_cross_agent_status_outside_the_allow_list_is_denied(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """Agent-to-agent on, but `ops` not in the allow list: OpenClaw's exact message."""
    run_to_end(rpc, OPS, "ops work")
    assert invoke("session_status", {"sessionKey": OPS}) == {
        "status": "forbidden",
        "error": "Agent-to-agent session status denied by tools.agentToAgent.allow.",
    }


@configured(ALL_A2A_BOTH)
def test_cross_agent_status_when_both_agents_are_allowed(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """Both agents allowed: the card of the other agent's session, its key in full."""
    run_id = run_to_end(rpc, OPS, "ops work")
    card = invoke("session_status", {"sessionKey": OPS})
    assert (card["sessionKey"], card["agentId"]) == (OPS, "ops")
    assert card["lastRun"]["runId"] == run_id
    assert card["usage"]["totalTokens"] > 0


@pytest.mark.parametrize(
    "config_data",
    [{}, {"agents": {"defaults": {"subagents": {"maxSpawnDepth": 2}}}}],
    ids=["leaf", "orchestrator"],
    indirect=True,
)
def test_sub_agents_never_get_session_status(
    client: httpx.Client, invoke: Callable[..., Any], services: Services
) -> None:
    """A sub-agent (leaf or orchestrator) is not offered the tool: 404, as any unknown tool."""
    child = "agent:main:subagent:kid"
    services.store.sessions.ensure(child, on_create={"spawnedBy": MAIN, "spawnDepth": 1})
    body = {"tool": "session_status", "args": {}, "sessionKey": child}
    resp = client.post("/tools/invoke", json=body)
    assert resp.status_code == 404, resp.text
    assert "session_status" in resp.json()["error"]["message"]
    services.store.sessions.ensure(MAIN)
    assert invoke("session_status")["ok"] is True  # the main session does get it


def test_an_agent_run_sees_itself_as_the_current_run(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """Through the model loop: `/tool session_status {}` inside a run reports that very run
    as the session's current run, running, nothing queued."""
    started = rpc("agent", sessionKey="main", message="/tool session_status {}")
    outcome = rpc("agent.wait", runId=started["runId"], timeoutMs=20_000)
    assert outcome["status"] == "ok", outcome
    card = json.loads(outcome["reply"])
    assert card["ok"] is True and card["sessionKey"] == "main"
    assert card["currentRun"]["runId"] == started["runId"]
    assert card["currentRun"]["status"] == "running"
    assert card["active"] is True and card["queue"] == {"depth": 0}
    assert card["lastRun"]["runId"] == started["runId"]
    assert card["time"]["lastRunEndedAt"] is None
