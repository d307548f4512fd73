"""`sessions_send` modes (OpenClaw 2026.9.6): steer, notify, resume, their refusals, over
/tools/invoke and inside agent runs, against a real Redis and worker.

The store is cut into slot groups with the slot check on (as on a Redis Cluster).
`steer` puts a message into the target's turn in flight: the model sees it at its next
step (after the tool call in flight, before the next model request), or, when the model's
last answer was under way, the turn goes on with it; with nothing in flight it is the next
turn. `notify` leaves a notification the next turn sees and starts no run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import httpx2
import mcp.types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from switchboard.shared.config import Settings
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
from switchboard.shared.store.runs import RunRecord
from switchboard.shared.tools import send_modes as modes
from switchboard.shared.tools.sessions_send import UNKNOWN_AGENT
from switchboard.shared.tools.sessions_yield import NOTHING_PENDING

pytestmark = pytest.mark.integration

TARGET = "agent:main:hook:target"
SLOW_TOOL_TURN = "/sleep 2\n/tool agents_list {}"  # a model step of 2 s, then a tool call


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The store cut into 8 slot groups with the slot check on: a step naming keys of two
    hash slots raises (every steer and notice step stays in its session's slot)."""
    return settings.model_copy(update={"slot_groups": 8, "slot_check": True})


@pytest.fixture
def config_data() -> dict[str, Any]:
    """No reply-back rounds (a followup's flow would add turns to the sessions); two
    configured agents, cross-agent sends allowed."""
    return {
        "session": {"agentToAgent": {"maxPingPongTurns": 0}},
        "agents": {"list": [{"id": "main", "default": True}, {"id": "ops"}]},
        "tools": {"agentToAgent": {"enabled": True, "allow": ["*"]}},
    }


def wait_until(check: Callable[[], Any], timeout_s: float = 30, what: str = "condition") -> Any:
    """Poll until `check()` is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def send(client: httpx.Client, session_key: str | None = None, **args: Any) -> dict[str, Any]:
    """Invoke sessions_send over HTTP (acting for ``session_key``) and return the result."""
    body: dict[str, Any] = {"tool": "sessions_send", "args": args}
    if session_key is not None:
        body["sessionKey"] = session_key
    resp = client.post("/tools/invoke", json=body)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def ended(services: Services, run_id: str, timeout_s: float = 30) -> RunRecord:
    """The run once it has ended."""

    def check() -> RunRecord | None:
        rec = services.store.runs.get(run_id)
        return rec if rec is not None and rec.terminal else None

    found: RunRecord = wait_until(check, timeout_s, what=f"run {run_id} to end")
    return found


def running(services: Services, run_id: str) -> None:
    """Wait for the run to be executing."""
    wait_until(lambda: services.store.runs.status(run_id) == "running", what="the run to start")


def user_texts(services: Services, key: str = TARGET) -> list[str]:
    """The session's user messages' contents, in order."""
    return [str(m["content"]) for m in services.store.transcripts.all(key) if m["role"] == "user"]


def started(services: Services, message: str, key: str = TARGET) -> str:
    """Start a turn of ``key`` with ``message``; its run id."""
    return str(start_run(services, RunRequest(session_key=key, message=message))["runId"])


# ---- refusals ------------------------------------------------------------------------------


def test_a_bad_mode_is_refused_with_openclaws_text(worker: Any, client: httpx.Client) -> None:
    """An unknown mode answers OpenClaw's error text and sends nothing."""
    for mode in ("shout", 3):
        result = send(client, sessionKey=TARGET, message="hi", mode=mode)
        assert (result["status"], result["error"]) == ("error", modes.BAD_MODE)


@pytest.mark.parametrize("mode", ["steer", "notify", "resume"])
def test_a_missing_session_is_refused_for_steer_notify_and_resume(
    worker: Any, client: httpx.Client, services: Services, mode: str
) -> None:
    """steer, notify and resume need an existing session: OpenClaw's text, nothing created."""
    result = send(client, sessionKey="hook:nobody", message="hi", mode=mode)
    assert (result["status"], result["error"]) == ("error", modes.MISSING_SESSION)
    assert services.store.sessions.get("agent:main:hook:nobody") is None


def test_resume_with_a_wait_is_refused(worker: Any, client: httpx.Client) -> None:
    """mode=resume with timeoutSeconds > 0 is refused: it answers admission only."""
    result = send(client, sessionKey=TARGET, message="hi", mode="resume", timeoutSeconds=5)
    assert (result["status"], result["error"]) == ("error", modes.RESUME_WAITS)


def test_an_unknown_agent_is_named(worker: Any, client: httpx.Client) -> None:
    """A label looked up in an agent that does not exist names it, and how to list agents."""
    result = send(client, label="x", agentId="ghost", message="hi")
    assert result["error"] == UNKNOWN_AGENT.format(agent_id="ghost")


# ---- steer -----------------------------------------------------------------------------------


def test_steer_with_nothing_in_flight_is_the_next_turn(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Steering an idle session queues the message as its next turn (`queued`), which runs."""
    ended(services, started(services, "/reply first"))
    result = send(client, sessionKey=TARGET, message="/reply second", mode="steer")
    assert result == {
        "status": "accepted",
        "runId": result["runId"],
        "sessionKey": TARGET,
        "targetDisposition": "queued",
    }
    assert ended(services, result["runId"]).reply == "second"


def test_steer_joins_the_running_turn_at_its_next_step(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Steered while a model step is under way, the message reaches the model after that
    step's tool call, in the same run (no run is started), and is written once."""
    run_id = started(services, SLOW_TOOL_TURN)
    running(services, run_id)
    result = send(client, sessionKey=TARGET, message="/reply steered in", mode="steer")
    assert result == {
        "status": "accepted",
        "runId": run_id,
        "sessionKey": TARGET,
        "targetDisposition": "steered",
    }
    rec = ended(services, run_id)
    assert (rec.status, rec.reply) == ("ok", "steered in")
    roles = [m["role"] for m in services.store.transcripts.all(TARGET)]
    assert roles == ["user", "assistant", "toolResult", "user", "assistant"]
    steered = [m for m in services.store.transcripts.all(TARGET) if m["role"] == "user"][-1]
    assert steered["content"] == "/reply steered in"  # as sent, with its provenance
    assert steered["provenance"]["mode"] == "steer"
    assert steered["provenance"]["sourceTool"] == "sessions_send"
    assert services.store.runs.lane_holder(TARGET) is None  # no other run
    assert services.store.steering.waiting(TARGET) == []
    entry = services.store.sessions.get(TARGET)
    assert entry is not None and not entry.get("steerQueued")


def test_steer_into_a_last_answer_under_way_goes_on_in_the_same_turn(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Steered while the model writes its final answer, the run does not end there: it
    keeps that answer and answers the steered message too."""
    run_id = started(services, "/sleep 2\n/reply first answer")
    running(services, run_id)
    result = send(client, sessionKey=TARGET, message="/reply second answer", mode="steer")
    assert result["targetDisposition"] == "steered" and result["runId"] == run_id
    rec = ended(services, run_id)
    assert (rec.status, rec.reply) == ("ok", "second answer")
    assistants = [
        m["content"][0]["text"]
        for m in services.store.transcripts.all(TARGET)
        if m["role"] == "assistant"
    ]
    assert assistants == ["first answer", "second answer"]
    assert services.store.steering.waiting(TARGET) == []


def lranges(services: Services) -> int:
    """LRANGE calls the Redis server has answered (scripts' included)."""
    stats = services.store.redis.info("commandstats")
    return int(stats.get("cmdstat_lrange", {}).get("calls", 0))


def test_the_steer_look_costs_one_command_per_tool_step_and_none_otherwise(
    worker: Any, services: Services
) -> None:
    """A turn without tool calls never looks at the steer inbox; a turn with one tool
    step looks once (one LRANGE), after its tool calls."""
    ended(services, started(services, "/reply warm"))  # the session exists
    before = lranges(services)
    ended(services, started(services, "/reply plain"))
    assert lranges(services) == before
    ended(services, started(services, "/tool agents_list {}"))
    assert lranges(services) == before + 1


def test_steer_into_a_parked_turn_is_taken_as_it_resumes(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A turn parked on its own waited send takes the steered message as it resumes,
    before its next model request."""
    args = {"sessionKey": "hook:other", "message": "/sleep 2\n/reply later", "timeoutSeconds": 20}
    run_id = started(services, f"/tool sessions_send {json.dumps(args)}")
    wait_until(lambda: services.store.runs.status(run_id) == "parked", what="the run to park")
    result = send(client, sessionKey=TARGET, message="/reply after the wait", mode="steer")
    assert (result["targetDisposition"], result["runId"]) == ("steered", run_id)
    rec = ended(services, run_id)
    assert (rec.status, rec.reply) == ("ok", "after the wait")
    roles = [m["role"] for m in services.store.transcripts.all(TARGET)]
    assert roles == ["user", "assistant", "toolResult", "user", "assistant"]
    assert services.store.steering.waiting(TARGET) == []


def test_steer_from_a_model_turn(worker: Any, services: Services) -> None:
    """A run's `/tool sessions_send {mode: steer}` reaches the other session's running turn."""
    target_run = started(services, SLOW_TOOL_TURN)
    running(services, target_run)
    args = {"sessionKey": TARGET, "message": "/reply from a model", "mode": "steer"}
    caller = started(services, f"/tool sessions_send {json.dumps(args)}", key="agent:main:main")
    answer = json.loads(ended(services, caller).reply or "{}")
    assert answer["targetDisposition"] == "steered" and answer["runId"] == target_run
    assert ended(services, target_run).reply == "from a model"


# ---- notify ----------------------------------------------------------------------------------


def test_notify_starts_no_run_and_the_next_turn_sees_it(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A notification answers `queued` with its id, starts nothing, and is in the history
    of the next turn, before that turn's message, once."""
    first = ended(services, started(services, "/reply first"))
    result = send(client, sessionKey=TARGET, message="the build is green", mode="notify")
    assert result == {
        "status": "queued",
        "sessionKey": TARGET,
        "notificationId": result["notificationId"],
        "runStarted": False,
    }
    time.sleep(0.5)
    entry = services.store.sessions.get(TARGET)
    assert entry is not None and entry.get("lastRunId") == first.run_id
    assert services.store.runs.lane_holder(TARGET) is None
    assert "the build is green" not in " ".join(user_texts(services))
    ended(services, started(services, "/reply second"))
    texts = user_texts(services)
    assert texts[-2] == "the build is green" and texts[-1] == "/reply second"
    notice = [m for m in services.store.transcripts.all(TARGET) if m["role"] == "user"][-2]
    assert notice["provenance"]["notificationId"] == result["notificationId"]
    assert services.store.steering.notices(TARGET) == []
    ended(services, started(services, "/reply third"))
    assert user_texts(services).count("the build is green") == 1


def test_deleting_a_session_drops_its_waiting_notices(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """`sessions.delete` removes what waited for the session's next turn with it."""
    ended(services, started(services, "/reply first"))
    assert send(client, sessionKey=TARGET, message="later", mode="notify")["status"] == "queued"
    assert services.store.steering.notices(TARGET) != []
    rpc("sessions.delete", key=TARGET)
    assert services.store.steering.notices(TARGET) == []
    assert services.store.sessions.get(TARGET) is None


def test_notify_from_a_model_turn(worker: Any, services: Services) -> None:
    """A run's `/tool sessions_send {mode: notify}` answers `queued` and starts no run."""
    ended(services, started(services, "/reply first"))
    args = {"sessionKey": TARGET, "message": "fyi", "mode": "notify"}
    caller = started(services, f"/tool sessions_send {json.dumps(args)}", key="agent:main:main")
    answer = json.loads(ended(services, caller).reply or "{}")
    assert (answer["status"], answer["runStarted"]) == ("queued", False)
    assert [n["content"] for n in services.store.steering.notices(TARGET)] == ["fyi"]


# ---- resume ----------------------------------------------------------------------------------


def test_resume_starts_a_turn_of_a_settled_session(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """resume answers admission only, naming the settled run; a turn in flight refuses it."""
    settled = ended(services, started(services, "/reply done"))
    result = send(client, sessionKey=TARGET, message="/reply again", mode="resume")
    assert result == {
        "status": "accepted",
        "mode": "resume",
        "runId": result["runId"],
        "taskRunId": settled.run_id,
        "sessionKey": TARGET,
        "completion": "task",
    }
    assert ended(services, result["runId"]).reply == "again"
    busy = started(services, "/sleep 2\n/reply busy")
    running(services, busy)
    refused = send(client, sessionKey=TARGET, message="hi", mode="resume")
    assert refused["error"] == modes.RESUME_BUSY.format(run_id=busy)


def test_resume_and_refusals_from_a_model_turn(worker: Any, services: Services) -> None:
    """A run's `/tool sessions_send` with mode resume is admitted and runs; a bad mode and
    a missing session come back to the model with OpenClaw's texts."""
    settled = ended(services, started(services, "/reply done"))
    calls = [
        {"sessionKey": TARGET, "message": "/reply resumed", "mode": "resume"},
        {"sessionKey": TARGET, "message": "hi", "mode": "later"},
        {"sessionKey": "hook:nobody", "message": "hi", "mode": "notify"},
    ]
    lines = "\n".join(f"/tool sessions_send {json.dumps(c)}" for c in calls)
    caller = ended(services, started(services, lines, key="agent:main:main"))
    resumed, bad, missing = (json.loads(line) for line in (caller.reply or "").splitlines())
    assert (resumed["mode"], resumed["taskRunId"]) == ("resume", settled.run_id)
    assert ended(services, resumed["runId"]).reply == "resumed"
    assert bad["error"] == modes.BAD_MODE
    assert missing["error"] == modes.MISSING_SESSION


# ---- over MCP --------------------------------------------------------------------------------


async def mcp_call(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    """A tool call over MCP; its JSON result."""
    result = await session.call_tool(tool, args)
    assert isinstance(result.content[0], types.TextContent)
    out: dict[str, Any] = json.loads(result.content[0].text)
    return out


def test_modes_and_yield_over_mcp(worker: Any, api_url: str, services: Services) -> None:
    """Through the api's `/mcp`: steer reaches a running turn, notify starts no run, and
    sessions_yield answers with the 2026.9.6 fields and text."""
    run_id = started(services, SLOW_TOOL_TURN)
    running(services, run_id)

    async def main() -> list[dict[str, Any]]:
        headers = {"Authorization": "Bearer test-token"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(f"{api_url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            steer = {"sessionKey": TARGET, "message": "/reply via mcp", "mode": "steer"}
            notice = {"sessionKey": TARGET, "message": "note", "mode": "notify"}
            return [
                await mcp_call(session, "sessions_send", **steer),
                await mcp_call(session, "sessions_send", **notice),
                await mcp_call(session, "sessions_yield"),
                await mcp_call(session, "sessions_yield", waitFor="message"),
            ]

    steered, notified, refused, waiting = anyio.run(main)
    assert (steered["targetDisposition"], steered["runId"]) == ("steered", run_id)
    assert (notified["status"], notified["runStarted"]) == ("queued", False)
    assert refused == {"status": "error", "error": NOTHING_PENDING}
    assert waiting == {"status": "yielded"}
    assert ended(services, run_id).reply == "via mcp"
    assert [n["content"] for n in services.store.steering.notices(TARGET)] == ["note"]
