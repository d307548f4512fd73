"""Gateway session methods over /rpc: sessions.list / resolve / patch / delete, chat.*."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from switchboard.shared.services import Services

pytestmark = pytest.mark.integration


def _run(rpc: Callable[..., Any], key: str, message: str = "hi", **extra: Any) -> dict[str, Any]:
    started = rpc("agent", sessionKey=key, message=message, **extra)
    outcome: dict[str, Any] = rpc("agent.wait", runId=started["runId"], timeoutMs=15_000)
    assert outcome["status"] == "ok"
    return outcome


def test_list_is_newest_first_with_filters(worker: Any, rpc: Callable[..., Any]) -> None:
    """sessions.list orders by updatedAt desc; limit, kinds and agentId filter."""
    for key in ("main", "cron:nightly", "discord:group:dev", "hook:h1"):
        _run(rpc, key)
    listing = rpc("sessions.list")
    keys = [r["key"] for r in listing["sessions"]]
    assert keys == [
        "agent:main:hook:h1",
        "agent:main:discord:group:dev",
        "agent:main:cron:nightly",
        "agent:main:main",
    ]
    assert listing["count"] == 4
    kinds = {r["key"]: (r["kind"], r["channel"]) for r in listing["sessions"]}
    assert kinds["agent:main:cron:nightly"] == ("cron", "internal")
    assert kinds["agent:main:discord:group:dev"] == ("group", "discord")
    assert kinds["agent:main:main"][0] == "main"
    assert [r["key"] for r in rpc("sessions.list", limit=2)["sessions"]] == keys[:2]
    groups = rpc("sessions.list", kinds=["group", "cron"])["sessions"]
    assert [r["key"] for r in groups] == keys[1:3]
    assert rpc("sessions.list", agentId="other")["sessions"] == []


def test_resolve_by_key_session_id_and_label(
    worker: Any, rpc: Callable[..., Any], client: httpx.Client
) -> None:
    """sessions.resolve accepts exactly one of key, sessionId, label."""
    _run(rpc, "hook:labelled", label="nightly-report")
    row = next(
        r for r in rpc("sessions.list")["sessions"] if r["key"] == "agent:main:hook:labelled"
    )
    assert rpc("sessions.resolve", key="hook:labelled")["key"] == "agent:main:hook:labelled"
    assert rpc("sessions.resolve", sessionId=row["sessionId"])["key"] == row["key"]
    assert rpc("sessions.resolve", label="nightly-report")["key"] == row["key"]
    both = client.post(
        "/rpc", json={"method": "sessions.resolve", "params": {"key": "main", "label": "x"}}
    )
    assert both.status_code == 400
    assert "not multiple" in both.json()["error"]["message"]
    missing = client.post("/rpc", json={"method": "sessions.resolve", "params": {"label": "nope"}})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "No session found with label: nope"


def test_patch_sets_and_clears_fields_and_keeps_labels_unique(
    worker: Any, rpc: Callable[..., Any], client: httpx.Client
) -> None:
    """sessions.patch sets fields, null clears them, a taken label is a 409."""
    _run(rpc, "hook:a")
    _run(rpc, "hook:b")
    patched = rpc("sessions.patch", key="hook:a", label="alpha", displayName="Alpha")
    assert patched["entry"]["label"] == "alpha"
    assert patched["entry"]["displayName"] == "Alpha"
    taken = client.post(
        "/rpc", json={"method": "sessions.patch", "params": {"key": "hook:b", "label": "alpha"}}
    )
    assert taken.status_code == 409
    cleared = rpc("sessions.patch", key="hook:a", label=None)
    assert "label" not in cleared["entry"]
    assert rpc("sessions.patch", key="hook:b", label="alpha")["entry"]["label"] == "alpha"
    bad_model = client.post(
        "/rpc", json={"method": "sessions.patch", "params": {"key": "hook:a", "model": "nope"}}
    )
    assert bad_model.status_code == 400
    assert "invalid model" in bad_model.json()["error"]["message"]


def test_delete_removes_the_session_but_never_main(
    worker: Any, rpc: Callable[..., Any], client: httpx.Client, services: Services
) -> None:
    """sessions.delete drops entry, transcript and index rows; main is refused."""
    _run(rpc, "hook:gone")
    assert rpc("sessions.delete", key="hook:gone") == {
        "ok": True,
        "key": "agent:main:hook:gone",
        "deleted": True,
    }
    assert services.store.transcripts.length("agent:main:hook:gone") == 0
    assert all(r["key"] != "agent:main:hook:gone" for r in rpc("sessions.list")["sessions"])
    refused = client.post("/rpc", json={"method": "sessions.delete", "params": {"key": "main"}})
    assert refused.status_code == 400
    assert rpc("sessions.delete", key="hook:never")["deleted"] is False


def test_chat_send_and_history(worker: Any, rpc: Callable[..., Any]) -> None:
    """chat.send starts a webchat run; chat.history hides control-token-only replies."""
    started = rpc("chat.send", sessionKey="main", message="from webchat")
    rpc("agent.wait", runId=started["runId"], timeoutMs=15_000)
    _run(rpc, "main", "/reply NO_REPLY")
    history = rpc("chat.history", sessionKey="main")
    texts = [
        m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
        for m in history["messages"]
    ]
    assert texts == ["from webchat", "from webchat", "/reply NO_REPLY"]
    assert history["messages"][0]["provenance"] == {
        "kind": "external_user",
        "sourceChannel": "webchat",
    }
    assert rpc("chat.history", sessionKey="main", limit=1)["messages"][0]["role"] == "user"


def test_delivery_context_is_seeded_from_the_first_request(
    worker: Any, rpc: Callable[..., Any]
) -> None:
    """A run with channel/to records the session's delivery context and last route."""
    _run(rpc, "main", channel="telegram", to="chat-42", accountId="bot-1")
    row = next(r for r in rpc("sessions.list")["sessions"] if r["key"] == "agent:main:main")
    assert row["deliveryContext"] == {"channel": "telegram", "to": "chat-42", "accountId": "bot-1"}
    assert (row["lastChannel"], row["lastTo"], row["channel"]) == (
        "telegram",
        "chat-42",
        "telegram",
    )
