"""`transcriptPath` is something a user can open: the api serves it as JSONL with the token.

Each test takes the path from a real answer (a `sessions_list` row, a `sessions.list` row,
a spawn's announce) and GETs it over real HTTP from the served api.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms
from switchboard.shared.tools.sessions_history import sanitize_message

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"


def invoke(client: httpx.Client, tool: str, **args: Any) -> Any:
    """Call a tool over `POST /tools/invoke` for the main session; its result."""
    resp = client.post("/tools/invoke", json={"tool": tool, "args": args, "sessionKey": "main"})
    assert resp.status_code == 200, resp.text
    return resp.json()["result"]


def jsonl(resp: httpx.Response) -> list[dict[str, Any]]:
    """The response's lines as JSON values, asserting a 200 JSONL answer."""
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in resp.text.splitlines()]


def wait_until(check: Any, timeout_s: float = 20, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def unmarked(message: dict[str, Any]) -> dict[str, Any]:
    """A history message without the read-side sequence mark."""
    return {k: v for k, v in message.items() if k != "__openclaw"}


def test_spawned_child_transcript_path_opens_to_its_history(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A child's row path serves its messages (as sessions_history shows them), oldest
    first, and the spawn's announce names the same path."""
    result = invoke(client, "sessions_spawn", task="say hi\n/reply done")
    child, run_id = result["childSessionKey"], result["runId"]
    wait_until(lambda: (r := services.store.runs.get(run_id)) and r.terminal, what="child run")
    rows = invoke(client, "sessions_list", kinds=["other"])["sessions"]
    (path,) = [row["transcriptPath"] for row in rows if row["sessionId"] == _sid(services, child)]
    assert path.startswith("/sessions/") and path.endswith("/transcript.jsonl")
    lines = jsonl(client.get(path))
    history = invoke(client, "sessions_history", sessionKey=child, includeTools=True)
    assert len(lines) >= 2 and lines[0]["role"] == "user"
    assert [sanitize_message(line).message for line in lines] == [
        unmarked(m) for m in history["messages"]
    ]
    wait_until(
        lambda: f"transcript {path}" in json.dumps(services.store.transcripts.all(MAIN)),
        what="announce naming the path",
    )


def test_gateway_row_path_streams_a_long_transcript_whole_and_in_order(
    client: httpx.Client, rpc: Any, services: Services
) -> None:
    """Past one page (500) the stream still carries every stored message once, in order."""
    key = "agent:main:hook:long"
    services.store.sessions.ensure(key)
    at = now_ms()
    for i in range(1203):
        services.store.transcripts.append(key, {"role": "user", "content": f"m{i}"}, at)
    (row,) = [r for r in rpc("sessions.list", limit=10)["sessions"] if r["key"] == key]
    lines = jsonl(client.get(row["transcriptPath"]))
    assert [line["content"] for line in lines] == [f"m{i}" for i in range(1203)]
    assert lines == [unmarked(m) for m in services.store.transcripts.all(key)]


def test_transcript_path_needs_the_token_and_a_known_session(
    api_url: str, client: httpx.Client, services: Services
) -> None:
    """No token: 401; an unknown session: 404 with the error body, not an empty stream."""
    services.store.sessions.ensure(MAIN)
    path = invoke(client, "sessions_list")["sessions"][0]["transcriptPath"]
    assert httpx.get(api_url + path).status_code == 401
    assert client.get(path).status_code == 200
    missing = client.get("/sessions/agent%3Amain%3Anobody/transcript.jsonl")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found"


def _sid(services: Services, key: str) -> str:
    """The sessionId of ``key``."""
    entry = services.store.sessions.get(key)
    assert entry is not None
    return entry.session_id
