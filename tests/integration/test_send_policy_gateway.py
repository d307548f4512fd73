"""Send policy where runs start (`agent`, `chat.send`), the per-session override and `/send`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from switchboard.shared.errors import Forbidden
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services

pytestmark = pytest.mark.integration


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Deny Discord groups by rule; everything else allowed."""
    return {
        "session": {
            "sendPolicy": {
                "rules": [{"match": {"channel": "discord", "chatType": "group"}, "action": "deny"}],
                "default": "allow",
            }
        }
    }


def _post(client: httpx.Client, method: str, **params: Any) -> httpx.Response:
    return client.post("/rpc", json={"method": method, "params": params})


def test_rule_denies_a_run_and_changes_nothing(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A matching deny rule rejects `agent` with the contract message; no session is made."""
    before = services.store.redis.dbsize()
    resp = _post(client, "agent", sessionKey="discord:group:dev", message="hi")
    assert resp.status_code == 403
    assert resp.json()["error"]["message"] == "send blocked by session policy"
    assert services.store.redis.dbsize() == before
    ok = _post(client, "agent", sessionKey="telegram:group:dev", message="hi")
    assert ok.status_code == 200


def test_owner_send_command_sets_and_clears_the_override(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any]
) -> None:
    """`/send off` blocks the session, `/send inherit` restores the rules, `/send on` allows."""
    off = rpc("agent", sessionKey="main", message="/send off")
    assert off["reply"] == "⚙️ Send policy set to off."
    assert _post(client, "chat.send", sessionKey="main", message="hello").status_code == 403
    rows = rpc("sessions.list")["sessions"]
    assert [r["sendPolicy"] for r in rows if r["key"] == "agent:main:main"] == ["deny"]
    back = rpc("chat.send", sessionKey="main", message="/send inherit")
    assert back["reply"] == "⚙️ Send policy set to inherit."
    started = rpc("agent", sessionKey="main", message="after")
    assert rpc("agent.wait", runId=started["runId"], timeoutMs=10_000)["reply"] == "after"
    usage = rpc("agent", sessionKey="main", message="/send maybe")
    assert usage["status"] == "error" and usage["reply"] == "⚙️ Usage: /send on|off|inherit"


def test_override_beats_a_deny_rule(client: httpx.Client, rpc: Callable[..., Any]) -> None:
    """`/send on` on a rule-denied session allows it; sessions.patch null clears it again."""
    rpc("agent", sessionKey="discord:group:ops", message="/send on")
    assert _post(client, "agent", sessionKey="discord:group:ops", message="x").status_code == 200
    rpc("sessions.patch", key="discord:group:ops", sendPolicy=None)
    assert _post(client, "agent", sessionKey="discord:group:ops", message="x").status_code == 403


def test_patch_deny_blocks_runs(client: httpx.Client, rpc: Callable[..., Any]) -> None:
    """sessions.patch sendPolicy=deny blocks; an invalid value is a 400 naming the field."""
    rpc("sessions.patch", key="hook:patched", sendPolicy="deny")
    assert _post(client, "agent", sessionKey="hook:patched", message="x").status_code == 403
    bad = _post(client, "sessions.patch", key="hook:patched", sendPolicy="maybe")
    assert bad.status_code == 400
    assert "sendPolicy" in bad.json()["error"]["message"]


def test_send_command_from_a_non_owner_is_refused(services: Services) -> None:
    """An inter-session `/send off` (not the token holder) is refused and changes nothing."""
    with pytest.raises(Forbidden, match="owner"):
        start_run(
            services,
            RunRequest(
                session_key="agent:main:main",
                message="/send off",
                provenance={"kind": "inter_session"},
            ),
        )
    assert services.store.sessions.get("agent:main:main") is None
