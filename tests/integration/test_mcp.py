"""The session tools over MCP, driven by the SDK's own client: streamable HTTP on the real
api (uvicorn) and `switchboard mcp` over stdio as a subprocess, both against the test's
private Redis and a real Celery worker answering with the echo model."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import httpx2
import mcp.types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from switchboard import cli
from switchboard.shared.config import Settings, reset_caches
from switchboard.shared.services import Services
from switchboard.shared.tools import sessions_send
from switchboard.shared.tools.catalog import ALL_TOOLS

pytestmark = pytest.mark.integration

TOKEN = "test-token"  # the integration conftest's token
# Every session tool of the catalog: a main session is offered all of them.
ALL_NAMES = {spec.name for spec in ALL_TOOLS}
TARGET = "agent:main:hook:mcp"
CHILD = "agent:main:subagent:child"
T = TypeVar("T")
Use = Callable[[ClientSession], Awaitable[T]]


@pytest.fixture
def config_data(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Agent-wide visibility, no reply-back rounds (the target's reply is the whole flow)."""
    base: dict[str, Any] = {
        "tools": {"sessions": {"visibility": "agent"}},
        "session": {"agentToAgent": {"maxPingPongTurns": 0}},
    }
    return {**base, **getattr(request, "param", {})}


def http_session(api_url: str, use: Use[T], headers: dict[str, str] | None = None) -> T:
    """Open an MCP session on the api's `/mcp` with the token (and ``headers``), run ``use``."""

    async def main() -> T:
        sent = {"Authorization": f"Bearer {TOKEN}", **(headers or {})}
        async with (
            httpx2.AsyncClient(headers=sent, timeout=60) as http,
            streamable_http_client(f"{api_url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await use(session)

    return anyio.run(main)


async def call(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    """A tool call that must succeed; its JSON result (structured and as text agree)."""
    result = await session.call_tool(tool, args)
    assert not result.is_error, result.content
    assert isinstance(result.content[0], types.TextContent)
    assert json.loads(result.content[0].text) == result.structured_content
    out: dict[str, Any] = result.structured_content
    return out


async def tool_names(session: ClientSession) -> set[str]:
    """The names of the tools offered."""
    return {tool.name for tool in (await session.list_tools()).tools}


async def send_list_and_read(session: ClientSession) -> dict[str, Any]:
    """A waiting send the worker answers, then the listing and the target's transcript."""
    sent = await call(
        session, "sessions_send", sessionKey=TARGET, message="ping over mcp", timeoutSeconds=20
    )
    listed = await call(session, "sessions_list")
    history = await call(session, "sessions_history", sessionKey=TARGET)
    return {"sent": sent, "listed": listed, "history": history}


def assert_round_trip(out: dict[str, Any]) -> None:
    """The send waited for the target run's own reply; list and history show it."""
    assert out["sent"]["status"] == "ok", out["sent"]
    assert out["sent"]["reply"] == "ping over mcp"
    assert TARGET in [row["key"] for row in out["listed"]["sessions"]]
    turns = [(m["role"], m["content"]) for m in out["history"]["messages"]]
    texts = [c if isinstance(c, str) else c[0]["text"] for _, c in turns]
    assert [role for role, _ in turns][:2] == ["user", "assistant"]
    assert texts[:2] == ["ping over mcp", "ping over mcp"]


# ---- streamable HTTP ---------------------------------------------------------------------


def test_http_lists_every_tool_with_its_schema(api_url: str) -> None:
    """tools/list: exactly the session tools, each schema the one agent runs are given."""

    async def use(session: ClientSession) -> list[types.Tool]:
        return (await session.list_tools()).tools

    tools = {tool.name: tool for tool in http_session(api_url, use)}
    assert set(tools) == ALL_NAMES
    send = tools["sessions_send"]
    assert send.input_schema == sessions_send.PARAMETERS
    assert send.description == sessions_send.DESCRIPTION
    assert tools["agents_list"].input_schema == {"type": "object", "properties": {}}


def test_http_waiting_send_list_and_history(worker: Any, api_url: str) -> None:
    """sessions_send with timeoutSeconds awaits the worker's reply; list and history follow."""
    assert_round_trip(http_session(api_url, send_list_and_read))


def test_http_cross_agent_target_is_a_forbidden_result(api_url: str) -> None:
    """A policy refusal is the tool's JSON result (not an MCP error), as over /tools/invoke."""

    async def use(session: ClientSession) -> dict[str, Any]:
        return await call(session, "sessions_send", sessionKey="agent:ops:main", message="hi")

    result = http_session(api_url, use)
    assert result["status"] == "forbidden"
    assert "agent" in result["error"].lower()


def test_http_invalid_arguments_are_tool_errors(api_url: str) -> None:
    """Bad input is an MCP tool error whose text is the clear message."""

    async def use(session: ClientSession) -> list[types.CallToolResult]:
        return [
            await session.call_tool("sessions_send", {"sessionKey": TARGET}),
            await session.call_tool("sessions_spawn", {"task": "x", "tasks": [{"task": "y"}]}),
            await session.call_tool("no_such_tool", {}),
        ]

    results = http_session(api_url, use)
    texts = []
    for result in results:
        assert result.is_error
        assert isinstance(result.content[0], types.TextContent)
        texts.append(result.content[0].text)
    assert texts == [
        "message required",
        "use either task or tasks, not both",
        "Tool not available: no_such_tool",
    ]


@pytest.mark.parametrize(
    "config_data", [{"agents": {"defaults": {"subagents": {"maxSpawnDepth": 2}}}}], indirect=True
)
@pytest.mark.parametrize("header", ["x-switchboard-session-key", "x-openclaw-session-key"])
def test_http_acting_as_a_subagent_offers_what_its_policy_allows(
    api_url: str, services: Services, header: str
) -> None:
    """The header picks the session: an orchestrator sub-agent loses send, agents_list and
    session_status."""
    services.store.sessions.ensure(
        CHILD, on_create={"spawnDepth": 1, "spawnedBy": "agent:main:main"}
    )

    async def use(session: ClientSession) -> tuple[set[str], types.CallToolResult, dict[str, Any]]:
        names = await tool_names(session)
        refused = await session.call_tool("sessions_send", {"sessionKey": "main", "message": "x"})
        own = await call(session, "sessions_history", sessionKey="current")
        return names, refused, own

    names, refused, own = http_session(api_url, use, {header: CHILD})
    # An orchestrator keeps the tools that manage its own children.
    assert names == {
        "sessions_list",
        "sessions_history",
        "sessions_spawn",
        "sessions_yield",
        "sessions_search",
        "subagents",
        "agents_wait",
    }
    assert refused.is_error
    assert isinstance(refused.content[0], types.TextContent)
    assert refused.content[0].text == "Tool not available: sessions_send"
    assert own["sessionKey"] == CHILD


def test_http_a_leaf_subagent_is_offered_only_sessions_yield(
    api_url: str, services: Services
) -> None:
    """At the default spawn depth a sub-agent is a leaf: every session tool is removed but
    `sessions_yield` (OpenClaw 2026.9.6: a leaf yields to wait for its requester's message)."""
    services.store.sessions.ensure(CHILD, on_create={"spawnDepth": 1})
    names = http_session(api_url, tool_names, {"x-switchboard-session-key": CHILD})
    assert names == {"sessions_yield"}


def test_http_needs_the_bearer_token(api_url: str) -> None:
    """401 without the token or with a wrong one, in the api's error shape."""
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    for auth in ({}, {"Authorization": "Bearer wrong"}):
        resp = httpx.post(f"{api_url}/mcp", json=init, headers={**accept, **auth}, timeout=10)
        assert resp.status_code == 401
        assert resp.headers["www-authenticate"] == "Bearer"
        assert resp.json()["error"]["type"] == "unauthorized"
    ok = httpx.post(
        f"{api_url}/mcp",
        json=init,
        headers={**accept, "Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert ok.status_code == 200, ok.text


# ---- stdio -------------------------------------------------------------------------------


def stdio_session(
    settings: Settings, config_data: dict[str, Any], tmp_path: Path, use: Use[T], *args: str
) -> T:
    """Start `switchboard mcp` as a subprocess on the test's Redis and config, run ``use``."""
    config_file = tmp_path / "switchboard.json"
    config_file.write_text(json.dumps(config_data))
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "switchboard", "mcp", "--config", str(config_file), *args],
        env={
            "SWITCHBOARD_REDIS_URL": settings.redis_url or "",
            "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
            "SWITCHBOARD_LOG_LEVEL": "WARNING",
            **{k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_SLOT_")},
        },
    )

    async def main() -> T:
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return await use(session)

    return anyio.run(main)


def test_stdio_serves_the_tools_for_its_session(
    worker: Any, settings: Settings, config_data: dict[str, Any], tmp_path: Path
) -> None:
    """`switchboard mcp`: the five tools, a waiting send the worker answers, list, history."""

    async def use(session: ClientSession) -> dict[str, Any]:
        return {"names": await tool_names(session), **await send_list_and_read(session)}

    out = stdio_session(settings, config_data, tmp_path, use, "--session-key", "main")
    assert out["names"] == ALL_NAMES
    assert_round_trip(out)


def test_mcp_command_rejects_an_unknown_session_id_clearly(
    settings: Settings,
    config_data: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An unknown sessionId ends `switchboard mcp` with one clear line, not a trace."""
    config_file = tmp_path / "switchboard.json"
    config_file.write_text(json.dumps(config_data))
    missing = "0b7b5c3e-9d7e-4a55-9a0b-6f1f3f3f3f3f"
    monkeypatch.setenv("SWITCHBOARD_REDIS_URL", settings.redis_url or "")
    monkeypatch.setattr(
        sys, "argv", ["switchboard", "mcp", "--config", str(config_file), "--session-key", missing]
    )
    try:
        with pytest.raises(SystemExit) as exited:
            cli.main()
    finally:
        reset_caches()
    assert exited.value.code == 1  # not found (README: exit codes)
    err = capsys.readouterr().err
    assert f"Session not found: {missing}" in err
    assert "Traceback" not in err


def test_http_sessions_search_answers_as_over_tools_invoke(
    api_url: str, services: Services
) -> None:
    """sessions_search is listed over MCP and its hits are the tool's JSON result."""
    services.store.sessions.ensure(TARGET, on_create={})
    message = {"role": "user", "content": [{"type": "text", "text": "the wombat report"}]}
    services.store.transcripts.append(TARGET, message, 1)

    async def use(session: ClientSession) -> tuple[set[str], dict[str, Any]]:
        names = await tool_names(session)
        return names, await call(session, "sessions_search", query="wombat", sessionKey=TARGET)

    names, found = http_session(api_url, use)
    assert "sessions_search" in names
    [hit] = found["results"]
    assert (hit["sessionKey"], hit["snippet"], hit["role"]) == (TARGET, "the wombat report", "user")
