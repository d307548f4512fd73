"""`sessions_spawn` end to end: real api, real worker, real Redis, a loopback chat webhook."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from switchboard.shared.flows.steps import run_step
from switchboard.shared.flows.subagent_archive import schedule_archive
from switchboard.shared.services import Services
from switchboard.shared.tools.offer import tools_for_session
from switchboard.shared.tools.registry import ToolContext, ToolSpec
from switchboard_testkit.fake_model import FakeModelServer

pytestmark = pytest.mark.integration

UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"


def subagent_key_pattern(agent: str) -> re.Pattern[str]:
    """`agent:<agent>:subagent:<uuid4>`."""
    return re.compile(f"agent:{agent}:subagent:{UUID4}")


# -- fixtures -----------------------------------------------------------------------------


class Receiver:
    """A chat platform stand-in: records every webhook POST it receives."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies received so far."""
        with self.lock:
            return list(self.posts)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    """A loopback webhook receiver and its URL."""
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with rec.lock:
                rec.posts.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield rec, f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    thread.join(5)


@pytest.fixture
def hook(receiver: tuple[Receiver, str]) -> Receiver:
    """The receiver behind `channels.hooktest.webhook`."""
    return receiver[0]


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeModelServer]:
    """A scriptable OpenAI-compatible model server (provider `fake`)."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def fake_model(fake_server: FakeModelServer) -> FakeModelServer:
    """The fake model server with an empty script."""
    fake_server.reset()
    return fake_server


@pytest.fixture
def config_data(
    receiver: tuple[Receiver, str], fake_server: FakeModelServer, request: pytest.FixtureRequest
) -> dict[str, Any]:
    """The `hooktest` webhook channel, the `fake` provider, and a test's extra (indirect)."""
    extra: dict[str, Any] = getattr(request, "param", {})
    return {
        "channels": {"hooktest": {"webhook": {"url": receiver[1]}}},
        "models": {
            "providers": {"fake": {"baseUrl": fake_server.base_url, "api": "openai-completions"}}
        },
        **extra,
    }


def _lookup_tool(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"answer": 42, "query": args.get("q")}


@pytest.fixture
def lookup_tool(services: Services) -> ToolSpec:
    """A plain (non-session) tool every run, sub-agents included, may use."""
    return services.tools.register(
        ToolSpec(
            name="lookup",
            description="Look something up.",
            parameters={"type": "object", "properties": {"q": {"type": "string"}}},
            handler=_lookup_tool,
            session_tool=False,
        )
    )


def subagents(**settings: Any) -> dict[str, Any]:
    """A config fragment setting `agents.defaults.subagents`."""
    return {"agents": {"defaults": {"subagents": settings}}}


# -- helpers ------------------------------------------------------------------------------


def spawn(client: httpx.Client, session: str = "main", **args: Any) -> dict[str, Any]:
    """Call sessions_spawn over /tools/invoke and return the tool result."""
    resp = client.post(
        "/tools/invoke", json={"tool": "sessions_spawn", "args": args, "sessionKey": session}
    )
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def wait_until(check: Callable[[], Any], timeout_s: float = 20, what: str = "condition") -> Any:
    """Poll until `check()` is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def announces(services: Services, key: str = "agent:main:main") -> list[dict[str, Any]]:
    """The sub-agent announces in a session's transcript."""
    return [
        m
        for m in services.store.transcripts.all(key)
        if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
    ]


def spawn_id_of(services: Services, run_id: str) -> str:
    """The spawn id recorded on a child run."""
    rec = services.store.runs.get(run_id)
    assert rec is not None
    return str(rec.meta["spawnId"])


def spawn_record(services: Services, run_id: str) -> dict[str, Any]:
    """The spawn hash of a child run."""
    found = services.store.spawns.get(spawn_id_of(services, run_id))
    assert found is not None
    return dict(found.fields)


def wait_done(services: Services, run_id: str) -> dict[str, Any]:
    """Wait until the child's spawn finished its announce and cleanup."""
    return wait_until(
        lambda: (r := spawn_record(services, run_id)).get("status") == "done" and r,
        what="the spawn to finish",
    )


def lines_of(message: dict[str, Any]) -> list[str]:
    """An announce's text, split into lines."""
    return str(message["content"]).splitlines()


def requester_on_hooktest(rpc: Callable[..., Any]) -> None:
    """Give the main session a chat route: hooktest, room-1."""
    started = rpc("agent", sessionKey="main", message="hello", channel="hooktest", to="room-1")
    assert rpc("agent.wait", runId=started["runId"], timeoutMs=10_000)["status"] == "ok"


# -- accepted at once, child session and lineage --------------------------------------------


def test_spawn_returns_accepted_at_once_with_a_fresh_child_session(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Non-blocking: accepted before the child ends; child key, entry and lineage recorded."""
    began = time.monotonic()
    result = spawn(client, task="work\n/sleep 2\n/reply done", label="research")
    assert time.monotonic() - began < 1.5
    assert result["status"] == "accepted"
    assert result["mode"] == "run"
    assert "Auto-announce is push-based" in result["note"]
    child = result["childSessionKey"]
    assert subagent_key_pattern("main").fullmatch(child)
    run = services.store.runs.get(result["runId"])
    assert run is not None and not run.terminal and run.session_key == child
    entry = services.store.sessions.get(child)
    assert entry is not None
    assert entry.get("spawnedBy") == "agent:main:main"
    assert entry.get("spawnDepth") == 1
    assert entry.get("subagentRole") == "leaf"
    assert entry.get("deliver") is False
    assert entry.get("label") == "research"
    assert (entry.get("modelProvider"), entry.get("model")) == ("builtin", "echo")
    assert services.store.sessions.children("agent:main:main") == [child]
    record = spawn_record(services, result["runId"])
    assert record["childKey"] == child and record["requesterKey"] == "agent:main:main"
    assert record["cleanup"] == "keep" and record["mode"] == "run"
    assert record["task"] == "work\n/sleep 2\n/reply done"
    first = run.message
    assert first is not None and first["provenance"]["sourceTool"] == "sessions_spawn"
    assert "[Subagent Task]: work\n/sleep 2" in first["content"]
    assert run.extra_system_prompt and "Your session: " + child in run.extra_system_prompt
    wait_done(services, result["runId"])


# -- the announce -------------------------------------------------------------------------


def test_announce_lands_in_requester_transcript_and_chat_exactly_once(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services, hook: Receiver
) -> None:
    """Status/Result/Notes + stats appended to the requester and delivered to its route once."""
    requester_on_hooktest(rpc)
    result = spawn(client, task="report\n/reply Status: timeout (just kidding)", label="job")
    record = wait_done(services, result["runId"])
    [message] = announces(services)
    lines = lines_of(message)
    assert lines[0] == 'A subagent task "job" just completed successfully.'
    assert lines[2:5] == ["Status: ok", "Result: Status: timeout (just kidding)", "Notes:"]
    stats = lines[-1]
    assert stats.startswith("Stats: runtime ")
    child = result["childSessionKey"]
    session_id = record["sessionId"]
    assert f" • sessionKey {child} • sessionId {session_id} • transcript " in stats
    assert stats.endswith(f"/sessions/{quote(child, safe='')}/transcript.jsonl")
    assert " • tokens " in stats and "(in " in stats and " / out " in stats
    assert message["provenance"] == {
        "kind": "inter_session",
        "sourceSessionKey": child,
        "sourceChannel": "internal",
        "sourceTool": "subagent_announce",
    }
    post = wait_until(hook.bodies, what="the webhook delivery")[0]
    assert post["channel"] == "hooktest" and post["to"] == "room-1"
    assert post["message"] == message["content"]
    assert post["idempotencyKey"] == f"announce:{record['spawnId']}"
    assert record["announce"] == "delivered" and record["deliveryId"]
    time.sleep(1.0)
    assert len(hook.bodies()) == 1
    assert len(announces(services)) == 1
    assert services.store.spawns.active_children("agent:main:main") == []


def _nap_tool(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    time.sleep(float(args.get("seconds", 1)))
    return {"napped": True}


@pytest.fixture
def nap_tool(services: Services) -> ToolSpec:
    """A plain tool that keeps the calling run busy for a while."""
    return services.tools.register(
        ToolSpec(
            name="nap",
            description="Sleep.",
            parameters={"type": "object", "properties": {"seconds": {"type": "number"}}},
            handler=_nap_tool,
            session_tool=False,
        )
    )


def test_spawn_from_an_agent_run_announces_after_the_parent_turn(
    worker: Any, rpc: Callable[..., Any], services: Services, nap_tool: ToolSpec
) -> None:
    """A model calling the tool gets `accepted`; the announce waits for the parent's turn."""
    args = {"task": "go\n/reply child result", "label": "from-run"}
    message = "/tool sessions_spawn " + json.dumps(args) + '\n/tool nap {"seconds": 1.5}'
    parent = rpc("agent", sessionKey="main", message=message)
    outcome = rpc("agent.wait", runId=parent["runId"], timeoutMs=15_000)
    assert outcome["status"] == "ok"
    accepted = json.loads(outcome["reply"].splitlines()[0])
    assert accepted["status"] == "accepted"
    child_run = services.store.runs.get(accepted["runId"])
    assert child_run is not None and child_run.ended_at_ms is not None
    parent_run = services.store.runs.get(parent["runId"])
    assert parent_run is not None and parent_run.ended_at_ms is not None
    assert child_run.ended_at_ms < parent_run.ended_at_ms  # the child ended mid-turn
    wait_until(lambda: announces(services), what="the announce")
    roles = [m["role"] for m in services.store.transcripts.all("agent:main:main")]
    assert roles == ["user", "assistant", "toolResult", "toolResult", "assistant", "user"]
    assert "Result: child result" in lines_of(announces(services)[0])


@pytest.mark.parametrize(
    ("args", "status", "notes"),
    [
        ({"task": "go\n/fail boom"}, "error", "boom"),
        ({"task": "go\n/sleep 5\n/reply too late", "runTimeoutSeconds": 1}, "timeout", "timed out"),
    ],
)
def test_status_comes_from_the_runtime_outcome(
    worker: Any,
    client: httpx.Client,
    services: Services,
    args: dict[str, Any],
    status: str,
    notes: str,
) -> None:
    """A failed child announces error and a child over its runTimeoutSeconds announces timeout."""
    result = spawn(client, **args)
    wait_done(services, result["runId"])
    lines = lines_of(announces(services)[0])
    assert f"Status: {status}" in lines
    assert "Result: (no output)" in lines
    [note] = [line for line in lines if line.startswith("Notes:")]
    assert notes in note
    run = services.store.runs.get(result["runId"])
    assert run is not None and run.status == status


def test_empty_reply_announces_the_latest_tool_result(
    worker: Any,
    client: httpx.Client,
    services: Services,
    lookup_tool: ToolSpec,
    fake_model: FakeModelServer,
) -> None:
    """When the child's final text is blank, its latest tool result is the Result."""
    fake_model.script(
        {"tool_calls": [{"name": "lookup", "arguments": json.dumps({"q": "life"})}]},
        {"content": "   "},
    )
    result = spawn(client, task="look it up", model="fake/fake-model")
    record = wait_done(services, result["runId"])
    assert record["outcome"] == "ok" and record["resultSource"] == "toolResult"
    lines = lines_of(announces(services)[0])
    assert 'Result: {"answer":42,"query":"life"}' in lines
    assert "Status: ok" in lines


def test_announce_skip_stays_silent(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services, hook: Receiver
) -> None:
    """A child replying exactly ANNOUNCE_SKIP is recorded as skipped; nothing is posted."""
    requester_on_hooktest(rpc)
    result = spawn(client, task="go\n/reply ANNOUNCE_SKIP")
    record = wait_done(services, result["runId"])
    assert record["announce"] == "skipped"
    time.sleep(0.5)
    assert announces(services) == []
    assert hook.bodies() == []
    assert services.store.spawns.active_children("agent:main:main") == []


# -- validation before anything is written --------------------------------------------------


def _subagent_sessions(services: Services) -> list[str]:
    """Every sub-agent session key in the store."""
    return [
        k
        for k, _ in services.store.sessions.recent_keys(
            agent_ids=None, kinds=None, min_updated_ms=None, limit=100
        )
        if ":subagent:" in k
    ]


def test_invalid_model_is_an_error_and_nothing_is_created(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """An unknown model fails the spawn before any session, record or run exists."""
    result = spawn(client, task="never runs", model="nope/model-x")
    assert result["status"] == "error"
    assert result["error"].startswith("invalid model: nope/model-x")
    assert _subagent_sessions(services) == []
    assert list(services.store.redis.scan_iter(match="sb:*spawn:*")) == []
    assert services.store.spawns.active_children("agent:main:main") == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            {"mode": "session"},
            'mode="session" requires thread=true so the subagent can stay bound to a thread.',
        ),
        (
            {"thread": True},
            "thread=true is unavailable because no channel plugin registered "
            "subagent_spawning hooks.",
        ),
        (
            {"thread": True, "mode": "session"},
            "thread=true is unavailable because no channel plugin registered "
            "subagent_spawning hooks.",
        ),
        (
            {"agentId": "Bad/Id"},
            'Invalid agentId "Bad/Id". Agent IDs must match [a-z0-9][a-z0-9_-]{0,63}. '
            "Use agents_list to discover valid targets.",
        ),
        (
            {"thinking": "extreme"},
            'Invalid thinking level "extreme". Use one of: off, minimal, low, medium, high, xhigh.',
        ),
    ],
)
def test_mode_thread_and_argument_errors(
    worker: Any, client: httpx.Client, services: Services, args: dict[str, Any], error: str
) -> None:
    """OpenClaw's exact messages as `status: error`, with nothing created."""
    assert spawn(client, task="x", **args) == {"status": "error", "error": error}
    assert _subagent_sessions(services) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "task required"),
        ({"task": "   "}, "task required"),
        (
            {"task": "x", "channel": "discord"},
            'sessions_spawn does not support "channel"; remove channel-delivery parameters.',
        ),
        ({"task": "x", "tasks": [{"task": "y"}]}, "use either task or tasks, not both"),
    ],
)
def test_malformed_calls_are_invalid_input(
    worker: Any, client: httpx.Client, args: dict[str, Any], message: str
) -> None:
    """Thrown errors (OpenClaw) come back as HTTP 400 with the message."""
    resp = client.post(
        "/tools/invoke", json={"tool": "sessions_spawn", "args": args, "sessionKey": "main"}
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == message


AGENTS = [{"id": "main", "default": True}, {"id": "research"}, {"id": "ops"}]


@pytest.mark.parametrize("config_data", [{"agents": {"list": AGENTS}}], indirect=True)
def test_other_agents_need_allow_agents(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """By default only the requester's own agent may be spawned."""
    result = spawn(client, task="x", agentId="research")
    assert result == {
        "status": "forbidden",
        "error": "agentId is not allowed for sessions_spawn (allowed: none)",
    }
    assert _subagent_sessions(services) == []
    same = spawn(client, task="go\n/reply same agent", agentId="main")
    assert same["status"] == "accepted"
    wait_done(services, same["runId"])


@pytest.mark.parametrize(
    "config_data",
    [
        {
            "agents": {
                "list": [*AGENTS[:1], {**AGENTS[1]}, AGENTS[2]],
                "defaults": {"subagents": {"allowAgents": ["research"]}},
            }
        }
    ],
    indirect=True,
)
def test_allow_agents_lists_the_allowed_ids(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """An allow-listed agent is spawned under its own key; others are refused by name."""
    refused = spawn(client, task="x", agentId="ops")
    assert refused["error"] == "agentId is not allowed for sessions_spawn (allowed: research)"
    result = spawn(client, task="go\n/reply hi", agentId="Research")
    assert result["status"] == "accepted"
    assert subagent_key_pattern("research").fullmatch(result["childSessionKey"])
    wait_done(services, result["runId"])
    assert "Result: hi" in lines_of(announces(services)[0])


def test_sub_agents_may_not_spawn_at_the_default_depth(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """maxSpawnDepth 1: a leaf is not offered sessions_spawn, and the depth check refuses it."""
    first = spawn(client, task="go\n/reply done")
    child = first["childSessionKey"]
    over_http = client.post(
        "/tools/invoke", json={"tool": "sessions_spawn", "args": {"task": "x"}, "sessionKey": child}
    )
    assert over_http.status_code == 404
    assert over_http.json()["error"]["message"] == "Tool not available: sessions_spawn"
    spec = services.tools.get("sessions_spawn")
    assert spec is not None
    ctx = ToolContext(services=services, session_key=child, agent_id="main", spawn_depth=1)
    assert spec.handler(ctx, {"task": "nested"}) == {
        "status": "forbidden",
        "error": "sessions_spawn is not allowed at this depth (current depth: 1, max: 1; "
        "agents.defaults.subagents.maxSpawnDepth).",
    }
    wait_done(services, first["runId"])


@pytest.mark.parametrize("config_data", [subagents(maxSpawnDepth=2)], indirect=True)
def test_orchestrators_spawn_leaves_when_depth_allows(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """With maxSpawnDepth 2 a child (orchestrator) spawns a leaf, announced back to the child."""
    nested = json.dumps({"task": "go\n/reply leaf result", "label": "leaf"})
    result = spawn(client, task=f"go\n/tool sessions_spawn {nested}")
    child = result["childSessionKey"]
    entry = services.store.sessions.get(child)
    assert entry is not None and entry.get("subagentRole") == "orchestrator"
    wait_until(lambda: announces(services, child), what="the leaf's announce to its parent")
    [leaf] = services.store.sessions.children(child)
    leaf_entry = services.store.sessions.get(leaf)
    assert leaf_entry is not None
    assert (leaf_entry.get("spawnDepth"), leaf_entry.get("subagentRole")) == (2, "leaf")
    assert leaf_entry.get("spawnedBy") == child
    assert "Result: leaf result" in lines_of(announces(services, child)[0])
    refused = client.post(
        "/tools/invoke", json={"tool": "sessions_spawn", "args": {"task": "x"}, "sessionKey": leaf}
    )
    assert refused.status_code == 404, "a leaf must not be offered sessions_spawn"
    wait_done(services, result["runId"])


@pytest.mark.parametrize("config_data", [subagents(maxChildrenPerAgent=2)], indirect=True)
def test_max_children_per_session(worker: Any, client: httpx.Client, services: Services) -> None:
    """At most maxChildrenPerAgent active children; batches count too; slots free up."""
    first = spawn(client, task="go\n/sleep 1.5\n/reply a")
    batch = spawn(client, tasks=["go\n/reply b", "go\n/reply c"])
    assert batch == {
        "status": "forbidden",
        "error": "sessions_spawn has reached max active children for this session (1/2; "
        "agents.defaults.subagents.maxChildrenPerAgent). A batch of 2 needs 1 more slot(s).",
    }
    second = spawn(client, task="go\n/sleep 1.5\n/reply b")
    assert second["status"] == "accepted"
    assert spawn(client, task="x") == {
        "status": "forbidden",
        "error": "sessions_spawn has reached max active children for this session (2/2; "
        "agents.defaults.subagents.maxChildrenPerAgent).",
    }
    wait_done(services, first["runId"])
    wait_done(services, second["runId"])
    again = spawn(client, tasks=["go\n/reply b", "go\n/reply c"])
    assert again["status"] == "accepted"
    for run in again["runs"]:
        wait_done(services, run["runId"])


@pytest.mark.parametrize("config_data", [subagents(maxChildrenPerAgent=1)], indirect=True)
def test_admission_text_reaches_the_model(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """A model spawning past maxChildrenPerAgent reads OpenClaw 2026.9.6's text, naming
    the config key, as its tool result."""
    call = "/tool sessions_spawn " + json.dumps({"task": "go\n/sleep 1\n/reply a"})
    turn = rpc("agent", sessionKey="main", message=f"{call}\n{call}")
    reply = rpc("agent.wait", runId=turn["runId"], timeoutMs=20_000)["reply"]
    first, second = (json.loads(line) for line in reply.splitlines()[:2])
    assert first["status"] == "accepted"
    assert second == {
        "status": "forbidden",
        "error": "sessions_spawn has reached max active children for this session (1/1; "
        "agents.defaults.subagents.maxChildrenPerAgent).",
    }
    wait_done(services, first["runId"])


# -- the sub-agent tool policy ---------------------------------------------------------------


def test_sub_agents_do_not_get_session_tools(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A child calling sessions_send finds no such tool, and nothing reaches the target."""
    send = json.dumps({"sessionKey": "main", "message": "psst", "timeoutSeconds": 0})
    result = spawn(client, task=f"go\n/tool sessions_send {send}")
    record = wait_done(services, result["runId"])
    child_messages = services.store.transcripts.all(result["childSessionKey"])
    [tool_result] = [m for m in child_messages if m["role"] == "toolResult"]
    assert tool_result["isError"] is True
    assert "Unknown tool name: 'sessions_send'" in tool_result["content"][0]["text"]
    assert "Unknown tool name: 'sessions_send'" in record["result"]
    sources = [
        (m.get("provenance") or {}).get("sourceTool")
        for m in services.store.transcripts.all("agent:main:main")
    ]
    assert sources == ["subagent_announce"]
    tool_names = _offered_tools(services, result["childSessionKey"])
    assert "sessions_send" not in tool_names and "sessions_spawn" not in tool_names
    assert "sessions_list" not in tool_names and "agents_list" not in tool_names


@pytest.mark.parametrize(
    "config_data",
    [{"tools": {"subagents": {"tools": {"alsoAllow": ["sessions_list"]}}}}],
    indirect=True,
)
def test_tools_subagents_also_allow_gives_a_session_tool_back(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """`tools.subagents.tools.alsoAllow` re-enables a session tool for sub-agents."""
    result = spawn(client, task='go\n/tool sessions_list {"limit": 1}\n/reply listed')
    record = wait_done(services, result["runId"])
    assert record["outcome"] == "ok" and record["result"] == "listed"
    assert "sessions_list" in _offered_tools(services, result["childSessionKey"])


def _offered_tools(services: Services, session_key: str) -> list[str]:
    entry = services.store.sessions.get(session_key)
    assert entry is not None
    ctx = ToolContext(
        services=services,
        session_key=session_key,
        agent_id="main",
        spawn_depth=int(entry.get("spawnDepth") or 0),
    )
    return [spec.name for spec in tools_for_session(services, ctx)]


# -- cleanup and archival ---------------------------------------------------------------------


def test_cleanup_delete_removes_the_child_after_its_announce(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """cleanup=delete: announced, then the child session is gone and its transcript exported."""
    result = spawn(client, task="go\n/reply bye", cleanup="delete")
    record = wait_done(services, result["runId"])
    child = result["childSessionKey"]
    assert "Result: bye" in lines_of(announces(services)[0])
    assert not services.store.sessions.exists(child)
    assert services.store.sessions.children("agent:main:main") == []
    exported = _export_path(services, record["sessionId"])
    assert [json.loads(line)["role"] for line in exported.read_text().splitlines()] == [
        "user",
        "assistant",
    ]


def _export_path(services: Services, session_id: str) -> Path:
    return Path(services.settings.data_dir) / "sessions" / f"{session_id}.jsonl"


def test_kept_children_are_archived_by_the_sweep(
    worker: Any, sweeper: None, client: httpx.Client, services: Services
) -> None:
    """cleanup=keep schedules archival archiveAfterMinutes later; the sweep exports and deletes."""
    result = spawn(client, task="go\n/reply keep me")
    record = wait_done(services, result["runId"])
    child = result["childSessionKey"]
    records = services.store.spawns
    due = records.archive_at(child)
    assert due is not None and abs(due - (record["endedAt"] + 60 * 60_000)) < 30_000
    assert services.store.sessions.exists(child)
    transcript = services.store.transcripts.all(child)
    records.unschedule_archive(child)
    schedule_archive(services, child, 0)
    wait_until(lambda: not services.store.sessions.exists(child), what="the archival")
    lines = _export_path(services, record["sessionId"]).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {k: v for k, v in m.items() if k != "__openclaw"} for m in transcript
    ]
    assert records.archive_at(child) is None


@pytest.mark.parametrize("config_data", [subagents(archiveAfterMinutes=0)], indirect=True)
def test_archive_after_zero_never_archives(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """archiveAfterMinutes 0 keeps the child session for good."""
    result = spawn(client, task="go\n/reply stay")
    wait_done(services, result["runId"])
    assert services.store.spawns.archive_at(result["childSessionKey"]) is None


# -- batch fan-out ----------------------------------------------------------------------------


def test_batch_each_announces_every_child(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """join=each (default): one announce per child, each with its own result."""
    result = spawn(client, tasks=[{"task": "go\n/reply one", "label": "a"}, "go\n/reply two"])
    assert result["status"] == "accepted" and result["join"] == "each"
    assert [r["childSessionKey"] for r in result["runs"]] == services.store.sessions.children(
        "agent:main:main"
    )
    for run in result["runs"]:
        wait_done(services, run["runId"])
    texts = sorted(m["content"] for m in announces(services))
    assert len(texts) == 2
    assert any("Result: one" in t for t in texts) and any("Result: two" in t for t in texts)


def test_batch_all_sends_one_combined_announce_with_partial_results(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services, hook: Receiver
) -> None:
    """join=all: one announce once all ended, timeouts and errors included as results."""
    requester_on_hooktest(rpc)
    tasks = [
        {"task": "go\n/reply fine", "label": "good"},
        {"task": "go\n/fail broken", "label": "bad"},
        {"task": "go\n/sleep 5\n/reply late", "label": "slow", "runTimeoutSeconds": 1},
    ]
    result = spawn(client, tasks=tasks, join="all")
    assert result["status"] == "accepted" and len(result["runs"]) == 3
    [message] = wait_until(lambda: announces(services), what="the combined announce")
    text = message["content"]
    assert (
        text.splitlines()[0] == "A subagent batch of 3 task(s) finished (1 error, 1 ok, 1 timeout)."
    )
    blocks = text.split("\n\n")[1:]
    assert [b.splitlines()[:3] for b in blocks] == [
        ["[1] good", "Status: ok", "Result: fine"],
        ["[2] bad", "Status: error", "Result: (no output)"],
        ["[3] slow", "Status: timeout", "Result: (no output)"],
    ]
    assert all(b.splitlines()[-1].startswith("Stats: runtime ") for b in blocks)
    post = wait_until(hook.bodies, what="the combined delivery")[0]
    assert post["message"] == text and post["to"] == "room-1"
    time.sleep(1.0)
    assert len(announces(services)) == 1 and len(hook.bodies()) == 1
    batch = services.store.spawns.get_batch(result["batchId"])
    assert batch is not None and batch.get("announce") == "delivered"
    assert services.store.spawns.active_children("agent:main:main") == []


def test_batch_is_validated_entirely_before_anything_starts(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """One bad entry refuses the whole batch, naming the entry; nothing is created."""
    result = spawn(client, tasks=["go\n/reply ok", {"task": "x", "model": "nope/m"}])
    assert result["status"] == "error"
    assert result["error"].startswith("tasks[1]: invalid model: nope/m")
    assert _subagent_sessions(services) == []
    assert list(services.store.redis.scan_iter(match="sb:*batch:*")) == []


# -- idempotent steps -------------------------------------------------------------------------


def test_duplicated_announce_and_join_steps_are_no_ops(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services, hook: Receiver
) -> None:
    """Running subagent_announce / batch_join again (in process and on the worker) adds nothing."""
    requester_on_hooktest(rpc)
    single = spawn(client, task="go\n/reply once")
    batch = spawn(client, tasks=["go\n/reply x", "go\n/reply y"], join="all")
    wait_done(services, single["runId"])
    for run in batch["runs"]:
        wait_done(services, run["runId"])
    wait_until(lambda: len(hook.bodies()) == 2, what="both deliveries")
    spawn_id = spawn_id_of(services, single["runId"])
    member_id = spawn_id_of(services, batch["runs"][0]["runId"])
    # As if a worker died after announcing but before recording that it finished.
    services.store.redis.hset(services.store.ks.spawn(spawn_id), "status", "running")
    services.store.redis.hset(services.store.ks.batch(batch["batchId"]), "status", "joining")
    for _ in range(2):
        run_step(services, "switchboard.subagent_announce", spawn_id)
        run_step(services, "switchboard.subagent_announce", member_id)
        run_step(services, "switchboard.batch_join", batch["batchId"])
        services.queue.enqueue("switchboard.subagent_announce", spawn_id)
        services.queue.enqueue("switchboard.batch_join", batch["batchId"])
    time.sleep(1.5)
    assert len(announces(services)) == 2
    assert len(hook.bodies()) == 2
