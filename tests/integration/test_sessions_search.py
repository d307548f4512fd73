"""`sessions_search` (OpenClaw 2026.9.6) over /tools/invoke, MCP's registry and the model
loop, on a real api, worker and Redis: hits, scoring, redaction, visibility and bounds."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any
from unittest import mock

import httpx
import pytest

import switchboard.shared.store.sessions as session_store
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms
from switchboard.shared.tools.sessions_search import SCAN_SESSIONS

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
_clock = itertools.count(now_ms() - 3_600_000, 1000)


def post(client: httpx.Client, args: dict[str, Any], session: str = "main") -> httpx.Response:
    """POST /tools/invoke for sessions_search."""
    body = {"tool": "sessions_search", "args": args, "sessionKey": session}
    return client.post("/tools/invoke", json=body)


def search(client: httpx.Client, session: str = "main", **args: Any) -> dict[str, Any]:
    """The tool's result (asserting HTTP 200)."""
    resp = post(client, args, session)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def seed(services: Services, key: str, *texts: str, role: str = "user") -> None:
    """A session whose transcript holds ``texts`` (one message each, one second apart)."""
    at = next(_clock)
    with mock.patch.object(session_store, "now_ms", return_value=at):
        services.store.sessions.ensure(key, on_create={})
    for text in texts:
        at = next(_clock)
        message = {"role": role, "content": [{"type": "text", "text": text}], "timestamp": at}
        services.store.transcripts.append(key, message, at)


def test_hits_carry_openclaws_fields_best_first_and_redacted(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """The whole phrase scores above one word; hits have sessionKey, sessionId, messageId,
    timestamp, role, a redacted snippet of at most 300 chars, and a score."""
    seed(services, "agent:main:alpha", "the blue whale migrates south", "nothing here")
    seed(services, "agent:main:beta", "a whale of a time", role="assistant")
    seed(services, "agent:main:gamma", "x " * 400 + "whale song token=sk_live_abcdefgh12345678")
    found = search(client, query="blue whale")
    assert "truncated" not in found
    hits = found["results"]
    assert hits[0]["sessionKey"] == "agent:main:alpha"
    assert hits[0]["score"] > hits[1]["score"] > 0
    assert {h["sessionKey"] for h in hits} == {
        "agent:main:alpha",
        "agent:main:beta",
        "agent:main:gamma",
    }
    top = hits[0]
    assert set(top) == {
        "sessionKey",
        "sessionId",
        "messageId",
        "timestamp",
        "role",
        "snippet",
        "score",
    }
    assert top["snippet"] == "the blue whale migrates south" and top["role"] == "user"
    beta = next(h for h in hits if h["sessionKey"] == "agent:main:beta")
    assert beta["role"] == "assistant"
    long = next(h for h in hits if h["sessionKey"] == "agent:main:gamma")
    assert len(long["snippet"]) <= 300 and "whale" in long["snippet"]
    assert "sk_live_abcdefgh12345678" not in long["snippet"]


def test_only_visible_sessions_are_searched_and_one_session_can_be_named(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Another agent's session is never a hit (visibility agent); sessionKey narrows the
    search to one session, and naming an invisible one is refused."""
    seed(services, "agent:main:mine", "shared secret word platypus")
    seed(services, "agent:ops:theirs", "platypus in ops")
    seed(services, "agent:main:other", "platypus again")
    keys = {h["sessionKey"] for h in search(client, query="platypus")["results"]}
    assert keys == {"agent:main:mine", "agent:main:other"}
    one = search(client, query="platypus", sessionKey="agent:main:other")["results"]
    assert [h["sessionKey"] for h in one] == ["agent:main:other"]
    refused = search(client, query="platypus", sessionKey="agent:ops:theirs")
    assert refused["status"] == "forbidden"
    assert refused["error"].startswith("Session search visibility is restricted.")


def test_limit_bad_queries_and_the_model_loop(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """limit defaults to 10 and stops at 25; an empty or over-4,096-char query is refused;
    the model's call answers as /tools/invoke does."""
    seed(services, "agent:main:many", *[f"kiwi number {n}" for n in range(30)])
    assert len(search(client, query="kiwi")["results"]) == 10
    assert len(search(client, query="kiwi", limit=100)["results"]) == 25
    for bad, text in (
        ("", "query required"),
        ("q" * 4097, "query must be at most 4096 characters"),
    ):
        resp = post(client, {"query": bad})
        assert resp.status_code == 400 and resp.json()["error"]["message"] == text
    # Named: the caller's own message (the call) holds the phrase too.
    call = json.dumps({"query": "kiwi number 7", "limit": 1, "sessionKey": "agent:main:many"})
    turn = rpc("agent", sessionKey="main", message=f"/tool sessions_search {call}")
    reply = rpc("agent.wait", runId=turn["runId"], timeoutMs=20_000)["reply"]
    [hit] = json.loads(reply.splitlines()[0])["results"]
    assert hit["sessionKey"] == "agent:main:many" and hit["snippet"] == "kiwi number 7"


def test_a_scan_that_leaves_sessions_out_says_truncated(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Beyond the newest visible sessions scanned, the answer is truncated with a warning."""
    for n in range(SCAN_SESSIONS + 1):
        seed(services, f"agent:main:s{n}", f"mango {n}")
    found = search(client, query="mango", limit=25)
    assert found["truncated"] is True and "sessionKey" in found["warning"]
    assert len(found["results"]) == 25


def test_a_leaf_subagent_is_not_offered_search(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """At the default depth a sub-agent is a leaf: sessions_search is denied (404)."""
    child = "agent:main:subagent:leaf"
    services.store.sessions.ensure(child, on_create={"spawnDepth": 1, "spawnedBy": MAIN})
    resp = post(client, {"query": "x"}, child)
    assert resp.status_code == 404
    assert resp.json()["error"]["message"] == "Tool not available: sessions_search"
