"""MCP progress: a waiting tool call that carries a progress token hears from the server
while it waits. The SDK's own client on both transports (streamable HTTP on the real api,
`switchboard mcp` over stdio as a subprocess), the test's private Redis and a real Celery
worker whose echo model takes about 2 s to answer (`/sleep`)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from switchboard.shared.config import Settings

pytestmark = pytest.mark.integration

TOKEN = "test-token"  # the integration conftest's token
TARGET = "agent:main:hook:progress"
MODEL_S = 2.5  # how long the target's model takes to answer
TIMEOUT_S = 20
Use = Callable[[ClientSession], Awaitable["Heard"]]


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Agent-wide visibility, no reply-back rounds (the target's reply is the whole flow),
    collector spawns allowed."""
    return {
        "tools": {"sessions": {"visibility": "agent"}, "swarm": {"enabled": True}},
        "session": {"agentToAgent": {"maxPingPongTurns": 0}},
    }


class Heard:
    """The progress notifications of one call and when they and the result arrived."""

    def __init__(self) -> None:
        self.progress: list[tuple[float, float | None, str | None, float]] = []
        self.result: dict[str, Any] = {}
        self.result_at = 0.0

    async def on_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append((progress, total, message, time.monotonic()))


async def slow_send(session: ClientSession) -> Heard:
    """A waiting sessions_send whose target takes ~2.5 s, with a progress callback."""
    heard = Heard()
    result = await session.call_tool(
        "sessions_send",
        {
            "sessionKey": TARGET,
            "message": f"/sleep {MODEL_S}\n/reply pong",
            "timeoutSeconds": TIMEOUT_S,
        },
        progress_callback=heard.on_progress,
    )
    heard.result_at = time.monotonic()
    assert not result.is_error, result.content
    heard.result = dict(result.structured_content or {})
    return heard


async def spawn_and_wait(session: ClientSession) -> Heard:
    """A collector child taking ~2.5 s, then `agents_wait` on it with a progress callback."""
    spawned = await session.call_tool(
        "sessions_spawn", {"task": f"child\n/sleep {MODEL_S}\n/reply done", "collect": True}
    )
    assert not spawned.is_error, spawned.content
    run_id = (spawned.structured_content or {})["runId"]
    heard = Heard()
    result = await session.call_tool(
        "agents_wait",
        {"ids": [run_id], "timeoutSeconds": TIMEOUT_S},
        progress_callback=heard.on_progress,
    )
    heard.result_at = time.monotonic()
    assert not result.is_error, result.content
    heard.result = dict(result.structured_content or {})
    heard.result["runId"] = run_id
    return heard


async def quick_list(session: ClientSession) -> Heard:
    """A tool that does not wait: no progress, even with a callback."""
    heard = Heard()
    result = await session.call_tool("sessions_list", {}, progress_callback=heard.on_progress)
    heard.result_at = time.monotonic()
    heard.result = dict(result.structured_content or {})
    return heard


def assert_progress_while_waiting(heard: Heard) -> None:
    """The reply came after the wait; before it, increasing progress out of the timeout."""
    assert heard.result["status"] == "ok", heard.result
    assert heard.result["reply"] == "pong"
    assert len(heard.progress) >= 1, "no progress notification during a 2.5 s wait"
    values = [p for p, _, _, _ in heard.progress]
    assert values == sorted(values) and len(set(values)) == len(values), values
    assert 0 < values[0] <= MODEL_S + 1
    assert all(total == TIMEOUT_S for _, total, _, _ in heard.progress)
    run_id = heard.result["runId"]
    messages = [message or "" for _, _, message, _ in heard.progress]
    assert all(m.startswith(f"waiting for run {run_id}: ") for m in messages), messages
    assert all(at <= heard.result_at for *_, at in heard.progress)


def http_session(api_url: str, use: Use) -> Heard:
    async def main() -> Heard:
        sent = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx2.AsyncClient(headers=sent, timeout=60) as http,
            streamable_http_client(f"{api_url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await use(session)

    return anyio.run(main)


def stdio_session(
    settings: Settings, config_data: dict[str, Any], tmp_path: Path, use: Use
) -> Heard:
    config_file = tmp_path / "switchboard.json"
    config_file.write_text(json.dumps(config_data))
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "switchboard", "mcp", "--config", str(config_file), "--session-key", "main"],
        env={
            "SWITCHBOARD_REDIS_URL": settings.redis_url or "",
            "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
            "SWITCHBOARD_LOG_LEVEL": "WARNING",
            **{k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_SLOT_")},
        },
    )

    async def main() -> Heard:
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return await use(session)

    return anyio.run(main)


def test_http_waiting_send_reports_progress(worker: Any, api_url: str) -> None:
    """Streamable HTTP: progress notifications arrive on the call's stream before the reply."""
    assert_progress_while_waiting(http_session(api_url, slow_send))


def test_http_agents_wait_on_a_spawn_reports_progress(worker: Any, api_url: str) -> None:
    """`agents_wait` on a collector child: progress while the child runs, then its result."""
    heard = http_session(api_url, spawn_and_wait)
    completed = heard.result["completed"]
    assert [(c["runId"], c["status"]) for c in completed] == [(heard.result["runId"], "done")]
    assert len(heard.progress) >= 1, "no progress notification while the child ran"
    values = [p for p, _, _, _ in heard.progress]
    assert values == sorted(values) and len(set(values)) == len(values), values
    assert all(total == TIMEOUT_S for _, total, _, _ in heard.progress)
    assert all(at <= heard.result_at for *_, at in heard.progress)


def test_http_a_call_that_does_not_wait_reports_none(api_url: str) -> None:
    """No wait, no progress (the reporter only speaks while a run is waited on)."""
    heard = http_session(api_url, quick_list)
    assert "sessions" in heard.result
    assert heard.progress == []


def test_stdio_waiting_send_reports_progress(
    worker: Any, settings: Settings, config_data: dict[str, Any], tmp_path: Path
) -> None:
    """`switchboard mcp`: the same progress over stdio."""
    assert_progress_while_waiting(stdio_session(settings, config_data, tmp_path, slow_send))
