"""`flows.list` over /rpc: the reply-back flows a session requested or was sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
ROOM = "agent:main:relay:group:room1"


@pytest.fixture
def config_data() -> dict[str, Any]:
    """main may send to the other sessions of its agent; no reply-back rounds."""
    return {
        "tools": {"sessions": {"visibility": "agent"}},
        "session": {"agentToAgent": {"maxPingPongTurns": 0}},
    }


def _send(client: httpx.Client, target: str, message: str) -> str:
    body = {
        "tool": "sessions_send",
        "args": {"sessionKey": target, "message": message, "timeoutSeconds": 0},
        "sessionKey": MAIN,
    }
    resp = client.post("/tools/invoke", json=body)
    assert resp.status_code == 200, resp.text
    result = resp.json()["result"]
    assert result["status"] == "accepted", result
    return str(result["flowId"])


def test_flows_list_shows_a_sessions_flows_newest_first(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any]
) -> None:
    """Both the requester and the target list the flow; other sessions do not; limit holds."""
    first = _send(client, ROOM, "first")
    second = _send(client, ROOM, "second")
    mine = rpc("flows.list", sessionKey="main")
    assert mine["sessionKey"] == MAIN and mine["count"] == 2
    assert [f["flowId"] for f in mine["flows"]] == [second, first]
    assert mine["flows"][0]["requesterSessionKey"] == MAIN
    assert mine["flows"][0]["targetSessionKey"] == ROOM
    assert mine["flows"][0]["message"] == "second"
    theirs = rpc("flows.list", sessionKey=ROOM, limit=1)
    assert [f["flowId"] for f in theirs["flows"]] == [second]
    assert rpc("flows.list", sessionKey="agent:main:elsewhere")["flows"] == []


@pytest.mark.parametrize(
    ("params", "field"), [({"limit": 0}, "limit"), ({"sessionKey": "agent::x"}, "sessionKey")]
)
def test_flows_list_rejects_bad_params(
    client: httpx.Client, params: dict[str, Any], field: str
) -> None:
    """Out-of-range limits and malformed keys are 400s naming the field."""
    resp = client.post("/rpc", json={"method": "flows.list", "params": params})
    assert resp.status_code == 400, resp.text
    assert field in resp.json()["error"]["message"]
