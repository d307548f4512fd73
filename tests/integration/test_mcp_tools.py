"""MCP servers as agent tools, over the real worker, Redis and api: stdio and Streamable
HTTP servers written with the `mcp` SDK (`examples/mcp/notes_server.py`), started here.

Runs use the echo model: `/tool notes__add {...}` makes the call, and the reply is the
tool's result as JSON (or the tool error the run went on with).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from switchboard_testkit.fake_model import FakeModelServer
from switchboard_testkit.up import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "mcp" / "notes_server.py"
MAIN = "agent:main:main"


def wait_port(port: int, timeout_s: float = 20.0) -> None:
    """Wait until something listens on the loopback port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


@pytest.fixture
def call_log(tmp_path: Path) -> Path:
    """Where the servers log each call (tool, arguments, idempotency key, pid)."""
    return tmp_path / "calls.jsonl"


@pytest.fixture
def http_server(call_log: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """The notes server over Streamable HTTP, on a free port."""
    port = free_port()
    env = {**os.environ, "NOTES_CALL_LOG": str(call_log)}
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    yield port, proc
    proc.kill()
    proc.wait(10)


@pytest.fixture
def config_data(
    request: pytest.FixtureRequest,
    call_log: Path,
    http_server: tuple[int, subprocess.Popen[bytes]],
) -> dict[str, Any]:
    """Two servers (stdio `notes`, HTTP `web`) and one that is never up (`gone`), plus
    the test's own keys (indirect parametrization)."""
    port, _ = http_server
    servers = {
        "notes": {
            "command": sys.executable,
            "args": [str(SERVER)],
            "env": {"NOTES_CALL_LOG": str(call_log)},
            "requestTimeoutMs": 2000,
            "toolFilter": {"exclude": ["whoami-not-there"]},
        },
        "web": {
            "url": f"http://127.0.0.1:{port}/mcp",
            "transport": "streamable-http",
            "toolFilter": {"include": ["echo", "add", "whoami"]},
        },
        "gone": {
            "url": f"http://127.0.0.1:{free_port()}/mcp",
            "transport": "streamable-http",
            "connectionTimeoutMs": 1000,
        },
    }
    extra: dict[str, Any] = dict(getattr(request, "param", {}))
    if extra.pop("fakeModel", False):  # runs on the fake OpenAI-compatible model server
        model: FakeModelServer = request.getfixturevalue("fake_model")
        provider = {"baseUrl": model.base_url, "api": "openai", "apiKey": "none"}
        extra["models"] = {"providers": {"fake": provider}}
        extra["agents"] = {"defaults": {"model": "fake/fake-model"}}
    return {**extra, "mcp": {"servers": servers}}


@pytest.fixture
def fake_model() -> Iterator[FakeModelServer]:
    """The fake OpenAI-compatible model server (it records the requests' offered tools)."""
    with FakeModelServer() as model:
        yield model


def configured(data: dict[str, Any]) -> pytest.MarkDecorator:
    """Run the test with these config keys beside the servers."""
    return pytest.mark.parametrize("config_data", [data], indirect=True)


def run(rpc: Callable[..., Any], message: str, session: str = MAIN) -> dict[str, Any]:
    """Run one turn to its end; its outcome."""
    started = rpc("agent", sessionKey=session, message=message)
    outcome: dict[str, Any] = rpc("agent.wait", runId=started["runId"], timeoutMs=30_000)
    assert outcome["status"] == "ok", outcome
    return outcome


def reply(rpc: Callable[..., Any], message: str, session: str = MAIN) -> str:
    """The reply of one turn."""
    return str(run(rpc, message, session).get("reply"))


def tool_results(invoke: Callable[..., Any], session: str = MAIN) -> list[dict[str, Any]]:
    """The session's toolResult messages, as `sessions_history` shows them."""
    answer = invoke("sessions_history", {"sessionKey": session, "includeTools": True})
    return [m for m in answer["messages"] if m["role"] == "toolResult"]


@pytest.fixture
def invoke(client: Any) -> Callable[..., Any]:
    """Call a tool over `POST /tools/invoke` for main and return its result."""

    def call(tool: str, args: dict[str, Any] | None = None, session: str = "main") -> Any:
        resp = client.post("/tools/invoke", json={"tool": tool, "args": args or {}})
        assert resp.status_code == 200, resp.text
        return resp.json()["result"]

    return call


def test_a_run_calls_a_stdio_server_tool_and_the_call_is_in_the_transcript(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """`/tool notes__add` reaches the stdio server; the toolResult records the call."""
    assert reply(rpc, '/tool notes__add {"a": 2, "b": 3}') == "5.0"
    [result] = tool_results(invoke)
    call = result["call"]
    assert (call["server"], call["tool"], call["outcome"]) == ("notes", "add", "ok")
    assert call["arguments"] == {"a": 2, "b": 3} and call["durationMs"] >= 0
    assert result["isError"] is False


def test_credentials_in_a_call_are_redacted_in_the_history(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """A credential in the arguments and the result is masked where the history shows it."""
    secret = "api_key=sk-live-0123456789abcdef0123"
    assert reply(rpc, "/tool notes__echo " + json.dumps({"text": secret})) == secret
    [result] = tool_results(invoke)
    assert "0123456789abcdef" not in json.dumps(result)
    assert "api_key=" in result["call"]["arguments"]["text"]


def test_a_run_calls_a_streamable_http_server_tool(
    worker: Any, rpc: Callable[..., Any], call_log: Path
) -> None:
    """`/tool web__echo` reaches the HTTP server, which sees the call's idempotency key."""
    assert reply(rpc, '/tool web__echo {"text": "over http"}') == "over http"
    [logged] = [json.loads(line) for line in call_log.read_text().splitlines()]
    assert logged["tool"] == "echo" and logged["key"].count(":") == 1


def test_the_connection_is_kept_across_runs(worker: Any, rpc: Callable[..., Any]) -> None:
    """Two runs reach the same stdio server process (one child of the worker)."""
    first = json.loads(reply(rpc, "/tool notes__whoami {}"))
    second = json.loads(reply(rpc, "/tool notes__whoami {}"))
    assert first["pid"] == second["pid"] != os.getpid()


def test_a_server_error_and_a_timeout_are_tool_errors_and_the_run_goes_on(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """A tool error and a call past requestTimeoutMs answer the model; the run ends ok."""
    text = reply(
        rpc, '/tool notes__fail {"message": "no such note"}\n/tool notes__slow {"seconds": 5}'
    )
    # A failed call reaches the model on pydantic-ai's error channel: {"error": text}.
    failed, slow = (json.loads(line)["error"] for line in text.splitlines())
    assert "no such note" in failed and "requestTimeoutMs" in slow
    outcomes = [r["call"]["outcome"] for r in tool_results(invoke)]
    assert outcomes == ["error", "timeout"]
    assert all(r["isError"] for r in tool_results(invoke))
    assert reply(rpc, '/tool notes__echo {"text": "still here"}') == "still here"


def test_a_server_that_is_down_leaves_the_other_tools_working(
    worker: Any,
    rpc: Callable[..., Any],
    http_server: tuple[int, subprocess.Popen[bytes]],
) -> None:
    """`gone` is never up: its tools are not offered, the others work; `web` going down
    mid-life answers its calls with an unavailable error."""
    assert reply(rpc, '/tool web__echo {"text": "up"}') == "up"
    _, proc = http_server
    proc.kill()
    proc.wait(10)
    answer = json.loads(reply(rpc, '/tool web__echo {"text": "down"}'))["error"]
    assert "MCP server 'web'" in answer
    assert reply(rpc, '/tool notes__echo {"text": "stdio"}') == "stdio"


def test_a_stdio_server_that_dies_is_started_again(worker: Any, rpc: Callable[..., Any]) -> None:
    """Killing the stdio server: a later call gets a new server process."""
    pid = json.loads(reply(rpc, "/tool notes__whoami {}"))["pid"]
    os.kill(pid, signal.SIGKILL)
    seen = {pid}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        answer = json.loads(reply(rpc, "/tool notes__whoami {}"))
        if "pid" in answer:
            seen.add(answer["pid"])
            break
        assert "MCP server 'notes'" in answer["error"]  # the call that found it dead
        time.sleep(0.2)
    assert len(seen) == 2


@configured({"tools": {"deny": ["notes__sl*"]}})
def test_tools_deny_hides_a_tool_and_status_shows_the_rest(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """A denied MCP tool is not offered; `session_status` and `agents_list` list the rest."""
    text = reply(rpc, '/tool notes__slow {"seconds": 0}')
    assert "Unknown tool name" in text and "notes__slow" in text
    assert "'notes__add'" in text
    tools = invoke("session_status")["tools"]
    assert "notes__add" in tools and "notes__slow" not in tools and "sessions_send" in tools
    [row] = invoke("agents_list")["agents"]
    assert "notes__slow" not in row["tools"]


@configured({"agents": {"list": [{"id": "main", "tools": {"allow": ["web__*", "sessions_*"]}}]}})
def test_an_agent_allow_list_keeps_only_its_tools(worker: Any, rpc: Callable[..., Any]) -> None:
    """`agents.list[].tools.allow` offers only matching tools (MCP and session alike)."""
    assert reply(rpc, '/tool web__add {"a": 1, "b": 1}') == "2.0"
    text = reply(rpc, '/tool notes__add {"a": 1, "b": 1}')
    assert "Unknown tool name" in text and "agents_list" not in text.split("Available")[1]


@configured({"tools": {"subagents": {"tools": {"deny": ["notes__fail"]}}}})
def test_a_sub_agent_calls_an_mcp_tool_and_a_denied_one_is_not_offered(
    worker: Any, rpc: Callable[..., Any], invoke: Callable[..., Any]
) -> None:
    """A sub-agent keeps the MCP tools (not the session tools) minus what is denied to it."""
    task = 'go\n/tool notes__echo {"text": "from the child"}\n/tool notes__fail {"message": "x"}'
    spawn = json.loads(reply(rpc, "/tool sessions_spawn " + json.dumps({"task": task})))
    child = spawn["childSessionKey"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        results = tool_results(invoke, child)
        if results:
            break
        time.sleep(0.1)
    by_text = {r["content"][0]["text"]: r for r in results}
    assert by_text["from the child"]["call"]["server"] == "notes"
    [unknown] = [t for t in by_text if t.startswith("Unknown tool name")]
    assert "'notes__fail'" in unknown and "'notes__echo'" in unknown.split("Available")[1]
    assert "sessions_send" not in unknown and "'notes__fail'" not in unknown.split("Available")[1]


@configured({"fakeModel": True, "tools": {"deny": ["notes__fail"]}})
def test_an_openai_compatible_model_is_offered_the_permitted_mcp_tools(
    worker: Any, rpc: Callable[..., Any], fake_model: FakeModelServer
) -> None:
    """Over the OpenAI API the model is offered the MCP tools minus the denied one, and
    gets the call's result as the tool message."""
    assert reply(rpc, '/tool notes__add {"a": 20, "b": 22}') == "42.0"
    first, second = httpx.get(f"{fake_model.url}/_requests").json()[-2:]
    offered = {t["function"]["name"] for t in first["tools"]}
    assert {"notes__add", "web__echo", "sessions_send"} <= offered
    assert "notes__fail" not in offered and not any(n.startswith("gone__") for n in offered)
    [tool_message] = [m for m in second["messages"] if m["role"] == "tool"]
    assert tool_message["content"] == "42.0"
