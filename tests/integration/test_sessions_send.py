"""`sessions_send` end to end: the tool over /tools/invoke and inside agent runs, the
reply-back loop, the announce and its delivery, against a real worker and loopback servers."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from switchboard.shared.delivery import records
from switchboard.shared.errors import Unavailable
from switchboard.shared.flows.a2a_flow import create_flow, get_flow, load_flow
from switchboard.shared.flows.a2a_rules import ping_pong_skip_reason
from switchboard.shared.flows.reply_back import STEP
from switchboard.shared.flows.steps import run_step_inline
from switchboard.shared.policy.send_policy import SEND_BLOCKED
from switchboard.shared.services import Services
from switchboard.shared.store.runs import RunRecord
from switchboard.shared.tools.registry import ToolContext, WaitFor
from switchboard.shared.tools.send_modes import NO_REPLY
from switchboard.shared.tools.sessions_send import SELF_WAIT, handle
from switchboard.workers.follow_ups import RUNS_TAKEN_HERE
from switchboard_testkit.fake_model import FakeModelServer
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
ROOM = "agent:main:relay:group:room1"
ANNOUNCE_TEXT = "Agent-to-agent announce step."


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    """An OpenAI-compatible fake model (used where the echo model cannot say a token)."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def extra_config() -> dict[str, Any]:
    """Per-test config on top of the module's (override with parametrize)."""
    return {}


@pytest.fixture
def config_data(
    webhook: WebhookReceiver, fake_model: FakeModelServer, extra_config: dict[str, Any]
) -> dict[str, Any]:
    """Same-agent visibility, a `relay` webhook channel, fast delivery retries."""
    fake_model.reset()
    base = {
        "tools": {"sessions": {"visibility": "agent"}},
        "channels": {"relay": {"webhook": {"url": webhook.url}}},
        "delivery": {"maxAttempts": 3, "backoffBaseS": 0.2, "backoffMaxS": 1, "timeoutS": 2},
        "models": {"providers": {"fake": {"baseUrl": fake_model.base_url, "api": "openai"}}},
    }
    return _merged(base, extra_config)


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _turns(n: int) -> dict[str, Any]:
    return {"session": {"agentToAgent": {"maxPingPongTurns": n}}}


def send(client: httpx.Client, session_key: str | None = None, **args: Any) -> dict[str, Any]:
    """Invoke sessions_send over HTTP acting for ``session_key`` and return the result."""
    body: dict[str, Any] = {"tool": "sessions_send", "args": args}
    if session_key is not None:
        body["sessionKey"] = session_key
    resp = client.post("/tools/invoke", json=body)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def finished_flow(services: Services, flow_id: str, timeout_s: float = 30) -> dict[str, Any]:
    """Poll until the flow is done and its delivery (if any) is settled."""
    deadline = time.monotonic() + timeout_s
    while True:
        flow = get_flow(services, flow_id)
        assert flow is not None
        delivery = flow["announce"].get("delivery")
        settled = delivery is None or delivery["status"] in records.TERMINAL_STATUSES
        if flow["status"] == "done" and settled:
            return flow
        assert time.monotonic() < deadline, f"flow not finished: {flow}"
        time.sleep(0.05)


def run_of(services: Services, run_id: str) -> RunRecord:
    """A run record that must exist."""
    rec = services.store.runs.get(run_id)
    assert rec is not None
    return rec


# ---- answers -----------------------------------------------------------------------------


@pytest.mark.parametrize("extra_config", [_turns(0)])
def test_fire_and_forget_is_accepted_at_once(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """timeoutSeconds=0 answers `accepted` before the target runs; the run then completes."""
    result = send(client, sessionKey="hook:ff", message="/sleep 1.5\nhi there", timeoutSeconds=0)
    assert result == {
        "runId": result["runId"],
        "status": "accepted",
        "sessionKey": "agent:main:hook:ff",
        "delivery": {"status": "pending", "mode": "announce"},
        "flowId": result["flowId"],
    }
    outcome = rpc("agent.wait", runId=result["runId"], timeoutMs=20_000)
    assert (outcome["status"], outcome["reply"]) == ("ok", "hi there")
    assert finished_flow(services, result["flowId"])["rounds"][0]["reply"] == "hi there"


@pytest.mark.parametrize("extra_config", [_turns(0)])
def test_waited_send_returns_the_target_runs_own_reply(worker: Any, client: httpx.Client) -> None:
    """timeoutSeconds>0 waits and returns `ok` with the final text of that very run."""
    result = send(client, sessionKey="hook:t", message="/reply pong", timeoutSeconds=20)
    assert result == {
        "runId": result["runId"],
        "status": "ok",
        "reply": "pong",
        "sessionKey": "agent:main:hook:t",
        "delivery": {"status": "pending", "mode": "announce"},
        "flowId": result["flowId"],
    }


@pytest.mark.parametrize("extra_config", [_turns(0)])
def test_a_stale_earlier_reply_is_never_returned(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A target answering only a control token gives `no_reply` (OpenClaw 2026.9.6's text),
    not its previous answer."""
    first = send(client, sessionKey="hook:stale", message="/reply old answer", timeoutSeconds=20)
    assert first["reply"] == "old answer"
    for token in ("REPLY_SKIP", "NO_REPLY"):
        result = send(client, sessionKey="hook:stale", message=f"/reply {token}", timeoutSeconds=20)
        assert result["status"] == "no_reply"
        assert result["message"] == NO_REPLY
        assert "reply" not in result
        assert run_of(services, result["runId"]).reply == token  # judged on this run's output


@pytest.mark.parametrize("extra_config", [_turns(0)])
def test_timeout_leaves_the_flow_running_and_it_announces_later(
    worker: Any, client: httpx.Client, services: Services, webhook: WebhookReceiver
) -> None:
    """A wait that expires says `timeout`; when the target ends, the announce is delivered."""
    result = send(
        client, sessionKey=ROOM, message="/sleep 2.5\n/reply late answer", timeoutSeconds=1
    )
    assert result["status"] == "timeout"
    assert "still running" in result["error"]
    assert "sessions_history" in result["error"]
    assert result["sessionKey"] == ROOM
    assert webhook.received == []
    (request,) = webhook.wait_for(1)
    assert request.body["message"] == ANNOUNCE_TEXT
    assert (request.body["channel"], request.body["to"]) == ("relay", "group:room1")
    flow = finished_flow(services, result["flowId"])
    assert flow["roundOneReply"] == "late answer"
    assert flow["announce"]["status"] == "delivered"


@pytest.mark.parametrize("extra_config", [_turns(0)])
def test_failed_target_run_is_an_error_and_nothing_is_announced(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A target run that fails answers `error` with its message; the flow stops there."""
    result = send(client, sessionKey="hook:bad", message="/fail boom", timeoutSeconds=20)
    assert result["status"] == "error"
    assert "boom" in result["error"]
    assert result["sessionKey"] == "agent:main:hook:bad"
    flow = finished_flow(services, result["flowId"])
    assert flow["stopReason"] == "primary_error"
    assert flow["announce"]["status"] == "not_run"


# ---- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize("extra_config", [{"tools": {"sessions": {"visibility": "tree"}}}])
def test_a_session_outside_the_tree_is_forbidden(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Under `tree`, another session of the agent is forbidden, naming the setting."""
    result = send(client, sessionKey="hook:other", message="hi", timeoutSeconds=0)
    assert result == {
        "runId": result["runId"],
        "status": "forbidden",
        "error": "Session send visibility is restricted to the current session tree "
        "(tools.sessions.visibility=tree).",
        "sessionKey": "agent:main:hook:other",
    }
    assert not services.store.sessions.exists("agent:main:hook:other")


def test_another_agent_is_forbidden_without_visibility_all(
    worker: Any, client: httpx.Client
) -> None:
    """A cross-agent target needs tools.sessions.visibility=all."""
    result = send(client, sessionKey="agent:ops:main", message="hi", timeoutSeconds=0)
    assert result["status"] == "forbidden"
    assert "tools.sessions.visibility=all" in result["error"]
    assert result["sessionKey"] == "agent:ops:main"


@pytest.mark.parametrize(
    "extra_config",
    [
        {
            "session": {
                "sendPolicy": {"rules": [{"match": {"keyPrefix": "hook:quiet"}, "action": "deny"}]}
            }
        }
    ],
)
def test_send_policy_deny_is_an_error_and_starts_nothing(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A denied target answers the contract error; no session or run is created."""
    result = send(client, sessionKey="hook:quiet", message="hi", timeoutSeconds=5)
    assert result == {
        "runId": result["runId"],
        "status": "error",
        "error": SEND_BLOCKED,
        "sessionKey": "agent:main:hook:quiet",
    }
    assert not services.store.sessions.exists("agent:main:hook:quiet")


@pytest.mark.parametrize("extra_config", [{"agents": {"defaults": {"sandbox": {"mode": "all"}}}}])
def test_a_sandboxed_session_reaches_only_what_it_spawned(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any]
) -> None:
    """Sandboxed callers get OpenClaw's spawned-only refusals, by key and by label."""
    by_key = send(client, sessionKey="hook:x", message="hi", timeoutSeconds=0)
    assert (by_key["status"], by_key["error"]) == (
        "forbidden",
        "Session not visible from this sandboxed agent session: hook:x",
    )
    rpc("sessions.patch", key="hook:labelled", label="labelled")
    by_label = send(client, label="labelled", message="hi", timeoutSeconds=0)
    assert by_label["error"] == "Session not visible from this sandboxed agent session."
    other_agent = send(client, label="labelled", agentId="ops", message="hi")
    assert other_agent["error"] == "Sandboxed sessions_send label lookup is limited to this agent"


def test_waiting_on_ones_own_session_is_refused(worker: Any, client: httpx.Client) -> None:
    """A synchronous self-send would wait behind its own turn, so it is refused."""
    result = send(client, sessionKey="main", message="hi", timeoutSeconds=5)
    assert (result["status"], result["error"], result["sessionKey"]) == ("error", SELF_WAIT, "main")


def test_argument_errors_match_openclaw(worker: Any, client: httpx.Client) -> None:
    """Both or neither of sessionKey/label, and a missing message, are refused as OpenClaw does."""
    both = send(client, sessionKey="hook:x", label="x", message="hi")
    assert (both["status"], both["error"]) == (
        "error",
        "Provide either sessionKey or label (not both).",
    )
    neither = send(client, message="hi")
    assert neither["error"] == "Either sessionKey or label is required"
    assert len(neither["runId"]) == 36
    resp = client.post(
        "/tools/invoke", json={"tool": "sessions_send", "args": {"sessionKey": "hook:x"}}
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "message required"


@pytest.mark.parametrize("extra_config", [_turns(0)])
def test_label_finds_the_target(worker: Any, client: httpx.Client, rpc: Callable[..., Any]) -> None:
    """A label resolves to its session; an unknown label is an error naming it."""
    rpc("sessions.patch", key="hook:helper", label="helper")
    found = send(client, label="helper", message="/reply at your service", timeoutSeconds=20)
    assert (found["status"], found["reply"]) == ("ok", "at your service")
    assert found["sessionKey"] == "agent:main:hook:helper"
    missing = send(client, label="nobody", message="hi")
    assert (missing["status"], missing["error"]) == ("error", "No session found with label: nobody")
    cross = send(client, label="helper", agentId="ops", message="hi")
    assert cross["status"] == "forbidden"
    assert "tools.agentToAgent.enabled=true" in cross["error"]


# ---- provenance, context, the reply-back loop and the announce ---------------------------


@pytest.mark.parametrize("extra_config", [_turns(0)])
def test_target_message_has_inter_session_provenance_and_a2a_context(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """The stored user message says who sent it; the run carries the A2A context prompt."""
    result = send(client, sessionKey="hook:p", message="hello target", timeoutSeconds=20)
    assert result["status"] == "ok"
    history = rpc("chat.history", sessionKey="agent:main:hook:p")["messages"]
    assert history[0]["role"] == "user"
    assert history[0]["provenance"] == {
        "kind": "inter_session",
        "sourceSessionKey": MAIN,
        "sourceChannel": "webchat",
        "sourceTool": "sessions_send",
    }
    rec = run_of(services, result["runId"])
    assert rec.channel == "webchat"
    assert rec.extra_system_prompt == (
        "Agent-to-agent message context:\n"
        "Agent 1 (requester) session: agent:main:main.\n"
        "Agent 1 (requester) channel: webchat.\n"
        "Agent 2 (target) session: agent:main:hook:p."
    )


@pytest.mark.parametrize("extra_config", [_turns(2)])
def test_two_rounds_then_one_announce_delivered_once(
    worker: Any,
    client: httpx.Client,
    rpc: Callable[..., Any],
    services: Services,
    webhook: WebhookReceiver,
) -> None:
    """Requester then target react once each, then the announce is POSTed exactly once."""
    result = send(client, sessionKey=ROOM, message="/reply hello requester", timeoutSeconds=20)
    assert result["reply"] == "hello requester"
    flow = finished_flow(services, result["flowId"])
    assert [(r["turn"], r["speaker"], r["sessionKey"], r["reply"]) for r in flow["rounds"]] == [
        (0, "target", ROOM, "hello requester"),
        (1, "requester", MAIN, "hello requester"),
        (2, "target", ROOM, "hello requester"),
    ]
    assert flow["stopReason"] == "max_turns"
    round_one = run_of(services, flow["rounds"][1]["runId"])
    assert round_one.extra_system_prompt == (
        "Agent-to-agent reply step:\n"
        "Current agent: Agent 1 (requester).\n"
        "Turn 1 of 2.\n"
        "Agent 1 (requester) session: agent:main:main.\n"
        "Agent 1 (requester) channel: webchat.\n"
        "Agent 2 (target) session: agent:main:relay:group:room1.\n"
        "Agent 2 (target) channel: relay.\n"
        'If you want to stop the ping-pong, reply exactly "REPLY_SKIP".'
    )
    requester_inbox = [
        m for m in rpc("chat.history", sessionKey="main")["messages"] if m["role"] == "user"
    ]
    assert requester_inbox[-1]["provenance"] == {
        "kind": "inter_session",
        "sourceTool": "sessions_send",
        "sourceSessionKey": ROOM,
        "sourceChannel": "relay",
    }
    announce = run_of(services, flow["announce"]["runId"])
    assert announce.message is not None and announce.message["content"] == ANNOUNCE_TEXT
    assert announce.extra_system_prompt == (
        "Agent-to-agent announce step:\n"
        "Agent 1 (requester) session: agent:main:main.\n"
        "Agent 1 (requester) channel: webchat.\n"
        "Agent 2 (target) session: agent:main:relay:group:room1.\n"
        "Agent 2 (target) channel: relay.\n"
        "Original request: /reply hello requester\n"
        "Round 1 reply: hello requester\n"
        "Latest reply: hello requester\n"
        'If you want to remain silent, reply exactly "ANNOUNCE_SKIP".\n'
        "Any other reply will be posted to the target channel.\n"
        "After this reply, the agent-to-agent conversation is over."
    )
    assert flow["announce"]["status"] == "delivered"
    time.sleep(0.5)
    (request,) = webhook.received
    assert request.body["message"] == ANNOUNCE_TEXT
    assert request.body["sessionKey"] == ROOM
    assert request.headers["idempotency-key"] == f"a2a:{result['flowId']}:announce"


def record_messages(monkeypatch: pytest.MonkeyPatch, services: Services) -> list[str]:
    """The names of the tasks sent as messages from now on (by the api and the worker)."""
    inner = services.queue.inner  # type: ignore[attr-defined]
    real = inner._send
    sent: list[str] = []

    def recording(task: str, *args: Any, **kwargs: Any) -> None:
        sent.append(task)
        real(task, *args, **kwargs)

    monkeypatch.setattr(inner, "_send", recording)
    return sent


@pytest.mark.parametrize("extra_config", [_turns(3)])
def test_the_rounds_and_announce_run_in_the_task_that_ran_the_target(
    worker: Any,
    client: httpx.Client,
    services: Services,
    webhook: WebhookReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runs a send's steps start (three rounds and the announce run, RUNS_TAKEN_HERE
    in all) are executed by the task that ran the target, and the announce step is no
    message of its own: the api's message and the webhook delivery are all that is sent.
    The flow is the same: three rounds, one announce, delivered once."""
    sent = record_messages(monkeypatch, services)
    result = send(client, sessionKey=ROOM, message="/reply hello requester", timeoutSeconds=0)
    flow = finished_flow(services, result["flowId"])
    assert [r["turn"] for r in flow["rounds"]] == [0, 1, 2, 3]
    assert all(r["status"] == "ok" for r in flow["rounds"])
    assert run_of(services, flow["announce"]["runId"]).status == "ok"
    assert flow["announce"]["status"] == "delivered"
    assert len(webhook.wait_for(1)) == 1
    assert RUNS_TAKEN_HERE == 4
    assert sent == ["switchboard.run", "switchboard.deliver"]


def test_a_step_following_its_run_inline_does_not_wait_for_the_run_to_be_recorded(
    services: Services,
) -> None:
    """sessions_send records the target's run on the flow just after starting it; a worker
    may end the run first. Its follow-up step, run inline, knows the run it follows and goes
    on (recording it) instead of waiting to be retried as a message of its own."""
    flow_id = create_flow(
        services,
        requester_key=MAIN,
        requester_channel="webchat",
        target_key=ROOM,
        target_display=ROOM,
        message="hello",
        max_turns=0,
        skip_reason=ping_pong_skip_reason(MAIN, ROOM, 0),  # as sessions_send records it
    )
    ended = RunRecord(
        run_id="run-not-recorded-yet",
        session_key=ROOM,
        status="ok",
        reply="hi back",
        meta={"flowId": flow_id, "a2a": "primary"},
    )
    with pytest.raises(Unavailable):  # a run it does not follow: wait for the record
        run_step_inline(services, STEP, flow_id, "0")
    other = RunRecord(run_id="r2", session_key=ROOM, status="ok", meta={"flowId": flow_id})
    with pytest.raises(Unavailable):  # a run of the flow, but not its primary run
        run_step_inline(services, STEP, flow_id, "0", following=other)
    run_step_inline(services, STEP, flow_id, "0", following=ended)
    flow = load_flow(services, flow_id)
    assert flow is not None
    assert flow.run_id(0) == "run-not-recorded-yet"
    assert flow.get("roundOneReply") == "hi back"
    assert flow.status == "announcing" and flow.get("announceRunId")


@pytest.mark.parametrize("extra_config", [_turns(5)])
def test_reply_skip_stops_the_loop(
    worker: Any, client: httpx.Client, services: Services, webhook: WebhookReceiver
) -> None:
    """A round answering exactly REPLY_SKIP ends the loop early; the announce still runs."""
    result = send(client, sessionKey=ROOM, message="/reply /reply REPLY_SKIP", timeoutSeconds=20)
    flow = finished_flow(services, result["flowId"])
    assert [(r["turn"], r.get("reply")) for r in flow["rounds"]] == [
        (0, "/reply REPLY_SKIP"),
        (1, "REPLY_SKIP"),
    ]
    assert flow["stopReason"] == "reply_skip"
    assert flow["announce"]["status"] == "delivered"
    assert len(webhook.wait_for(1)) == 1


@pytest.mark.parametrize(
    "extra_config", [{**_turns(0), "agents": {"defaults": {"model": "fake/fake-model"}}}]
)
def test_announce_skip_stays_silent(
    worker: Any,
    client: httpx.Client,
    services: Services,
    webhook: WebhookReceiver,
    fake_model: FakeModelServer,
) -> None:
    """An announce run answering exactly ANNOUNCE_SKIP delivers nothing, and says so."""
    fake_model.script({"content": "the answer"}, {"content": "ANNOUNCE_SKIP"})
    result = send(client, sessionKey=ROOM, message="question", timeoutSeconds=20)
    assert result["reply"] == "the answer"
    flow = finished_flow(services, result["flowId"])
    assert flow["announce"]["status"] == "skipped"
    assert "deliveryId" not in flow["announce"]
    time.sleep(0.5)
    assert webhook.received == []
    prompts = [m["content"] for body in fake_model.requests() for m in body["messages"]]
    assert any(p.startswith("Agent-to-agent message context:") for p in prompts)
    assert any(p.startswith("Agent-to-agent announce step:") for p in prompts)


@pytest.mark.parametrize("extra_config", [_turns(0)])
def test_max_ping_pong_turns_zero_goes_straight_to_the_announce(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """With maxPingPongTurns 0 no round runs; the announce does (no route → `no_target`)."""
    result = send(client, sessionKey="hook:solo", message="/reply done", timeoutSeconds=20)
    flow = finished_flow(services, result["flowId"])
    assert [r["turn"] for r in flow["rounds"]] == [0]
    assert (flow["pingPongSkipped"], flow["stopReason"]) == ("disabled", "disabled")
    assert flow["announce"]["status"] == "no_target"
    assert flow["announce"]["reply"] == ANNOUNCE_TEXT


def test_fire_and_forget_to_oneself_skips_the_ping_pong(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A send to one's own session without waiting is allowed, with no reply-back loop."""
    result = send(client, sessionKey="main", message="/reply note to self", timeoutSeconds=0)
    assert result["status"] == "accepted"
    flow = finished_flow(services, result["flowId"])
    assert [r["turn"] for r in flow["rounds"]] == [0]
    assert flow["stopReason"] == "self_send"
    assert flow["announce"]["runId"]


@pytest.mark.parametrize("extra_config", [_turns(0)])
def test_waiting_send_inside_an_agent_run_parks_and_resumes(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """A model's waiting sessions_send parks its run, which resumes with the target's reply."""
    args = {"sessionKey": "hook:inner", "message": "/sleep 1\n/reply inner reply"}
    line = "/tool sessions_send " + json.dumps({**args, "timeoutSeconds": 10})
    caller = rpc("agent", sessionKey="main", message=line)
    deadline = time.monotonic() + 10
    while run_of(services, caller["runId"]).status != "parked":
        assert time.monotonic() < deadline, "the caller never parked"
        time.sleep(0.05)
    outcome = rpc("agent.wait", runId=caller["runId"], timeoutMs=20_000)
    assert outcome["status"] == "ok"
    tool_result = json.loads(outcome["reply"])
    assert tool_result["status"] == "ok"
    assert tool_result["reply"] == "inner reply"
    assert tool_result["sessionKey"] == "agent:main:hook:inner"
    target_run = run_of(services, tool_result["runId"])
    assert target_run.message is not None
    assert target_run.message["provenance"]["sourceSessionKey"] == MAIN


def test_a_waiting_send_starts_its_run_watched_and_a_fire_and_forget_one_does_not(
    services: Services,
) -> None:
    """Only a run someone waits for has its end published (`RunWaiter`): a waiting send
    marks its run as it starts it, so the api's wait, which skips the first read for a
    run it started, is woken by the end rather than by its next poll."""
    ctx = ToolContext(services=services, session_key=MAIN, agent_id="main")
    with pytest.raises(WaitFor) as waiting:
        handle(ctx, {"sessionKey": ROOM, "message": "wait for me", "timeoutSeconds": 5})
    accepted = handle(ctx, {"sessionKey": ROOM, "message": "no wait", "timeoutSeconds": 0})
    assert accepted["status"] == "accepted"
    redis, ks = services.store.redis, services.store.ks
    assert redis.hget(ks.run(waiting.value.target_run_id), "watch") == b"1"
    assert redis.hget(ks.run(str(accepted["runId"])), "watch") is None
