"""`sessions_list` paging and filters and `sessions_history` pendingInputs (OpenClaw
2026.9.6), over /tools/invoke and from an agent run, on a real api, worker and Redis."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import httpx
import pytest

import switchboard.shared.store.sessions as session_store
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms

pytestmark = pytest.mark.integration

BUSY = "agent:main:busy"


def invoke(client: httpx.Client, tool: str, session: str = "main", **args: Any) -> Any:
    """Call a tool over /tools/invoke acting for ``session``; its result."""
    resp = client.post("/tools/invoke", json={"tool": tool, "args": args, "sessionKey": session})
    assert resp.status_code == 200, resp.text
    return resp.json()["result"]


def seed_sessions(services: Services, keys: list[str]) -> None:
    """Create the sessions, each one second newer than the one before."""
    clock = itertools.count(now_ms() - 60_000, 1000)
    for key in keys:
        with mock.patch.object(session_store, "now_ms", return_value=next(clock)):
            services.store.sessions.ensure(key, on_create={})


def keys_of(result: dict[str, Any]) -> list[str]:
    """The row keys of a listing, in order."""
    return [row["key"] for row in result["sessions"]]


def wait_until(check: Callable[[], Any], timeout_s: float = 20) -> Any:
    """Poll until ``check()`` is truthy; its value."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def test_offset_pages_through_the_listing(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """Pages of `limit` rows follow `nextOffset` until `hasMore` is false, newest first,
    every session once; the model's call pages the same way."""
    names = [f"agent:main:s{n}" for n in range(7)]
    seed_sessions(services, ["agent:main:main", *names])
    seen: list[str] = []
    offset: int | None = 0
    pages = 0
    while offset is not None:
        page = invoke(client, "sessions_list", limit=3, offset=offset)
        assert page["offset"] == offset and page["count"] == len(page["sessions"])
        seen += keys_of(page)
        offset = page.get("nextOffset") if page["hasMore"] else None
        pages += 1
    assert pages == 3 and len(seen) == len(set(seen)) == 8
    assert seen[:2] == ["agent:main:s6", "agent:main:s5"]
    last = invoke(client, "sessions_list", limit=3, offset=6)
    assert (last["hasMore"], "nextOffset" in last, last["count"]) == (False, False, 2)
    call = json.dumps({"limit": 2, "offset": 2})
    turn = rpc("agent", sessionKey="agent:main:s0", message=f"/tool sessions_list {call}")
    reply = rpc("agent.wait", runId=turn["runId"], timeoutMs=20_000)["reply"]
    through_loop = json.loads(reply.splitlines()[0])
    assert (through_loop["offset"], through_loop["hasMore"], through_loop["nextOffset"]) == (
        2,
        True,
        4,
    )
    assert through_loop["count"] == 2


def test_exclude_subagents_archived_and_bad_archived(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """`excludeSubagents` drops sub-agent sessions; `archived: true` lists none (archived
    sessions leave the store) and says so; `"all"` is the live ones; other values are refused."""
    seed_sessions(services, ["agent:main:main", "agent:main:subagent:a", "agent:main:other"])
    assert len(keys_of(invoke(client, "sessions_list"))) == 3
    kept = keys_of(invoke(client, "sessions_list", excludeSubagents=True))
    assert len(kept) == 2 and not any("subagent" in k for k in kept)
    archived = invoke(client, "sessions_list", archived=True)
    assert archived["count"] == 0 and "Archived" in archived["scope"]["note"]
    assert invoke(client, "sessions_list", archived="all")["count"] == 3
    resp = client.post(
        "/tools/invoke",
        json={"tool": "sessions_list", "args": {"archived": "maybe"}, "sessionKey": "main"},
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == 'archived must be true, false, or "all"'


def test_a_session_whose_run_waits_for_a_worker_is_queued(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A row's status is `queued` (not `running`) while the session's run waits."""
    services.store.sessions.ensure("agent:main:waiting", on_create={"status": "queued"})
    [row] = invoke(client, "sessions_list", activeOnly=True)["sessions"]
    assert (row["key"], row["status"]) == ("agent:main:waiting", "queued")


def test_active_only_queued_status_and_pending_inputs(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """While a run sleeps and a second message waits behind it: `activeOnly` lists just
    that session, and its history's `pendingInputs` holds the waiting message (also from
    the model loop); once both ran, nothing is pending."""
    seed_sessions(services, ["agent:main:main", "agent:main:idle"])
    first = rpc("agent", sessionKey=BUSY, message="/sleep 4\n/reply one")
    wait_until(lambda: services.store.runs.status(first["runId"]) == "running")
    second = rpc("agent", sessionKey=BUSY, message="/reply two")
    assert services.store.runs.status(second["runId"]) == "queued"
    active = invoke(client, "sessions_list", activeOnly=True)
    assert keys_of(active) == [BUSY]
    history = invoke(client, "sessions_history", sessionKey=BUSY)
    [pending] = history["pendingInputs"]
    assert (pending["runId"], pending["status"]) == (second["runId"], "queued")
    assert "/reply two" in json.dumps(pending["message"])
    args = json.dumps({"sessionKey": BUSY})
    turn = rpc("agent", sessionKey="main", message=f"/tool sessions_history {args}")
    reply = rpc("agent.wait", runId=turn["runId"], timeoutMs=20_000)["reply"]
    seen = json.loads(reply.splitlines()[0])
    assert [p["runId"] for p in seen["pendingInputs"]] == [second["runId"]]
    rpc("agent.wait", runId=second["runId"], timeoutMs=20_000)
    assert invoke(client, "sessions_history", sessionKey=BUSY)["pendingInputs"] == []
    assert keys_of(invoke(client, "sessions_list", activeOnly=True)) == []
