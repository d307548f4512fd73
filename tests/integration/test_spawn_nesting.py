"""Nested sub-agents end to end (real api, worker and Redis; the echo model's `/tool`):
with `maxSpawnDepth: 2` a child (orchestrator) spawns its own child (a leaf), the leaf is
denied the orchestration tools, `maxChildrenPerAgent` holds per requester session at each
level with OpenClaw's text, and announces climb one level at a time."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from switchboard.shared.services import Services
from switchboard.shared.tools.offer import tools_for_session
from switchboard.shared.tools.registry import ToolContext

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.fixture
def config_data(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The test's config (indirect parametrization)."""
    data: dict[str, Any] = getattr(request, "param", {})
    return data


def subagents(**settings: Any) -> dict[str, Any]:
    """A config fragment setting `agents.defaults.subagents`."""
    return {"agents": {"defaults": {"subagents": settings}}}


def spawn(client: httpx.Client, session: str = "main", **args: Any) -> dict[str, Any]:
    """Call sessions_spawn over /tools/invoke and return the tool result."""
    body = {"tool": "sessions_spawn", "args": args, "sessionKey": session}
    resp = client.post("/tools/invoke", json=body)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def wait_until(check: Callable[[], Any], timeout_s: float = 30, what: str = "condition") -> Any:
    """Poll until `check()` is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def announces(services: Services, key: str) -> list[dict[str, Any]]:
    """The sub-agent announces in a session's transcript."""
    return [
        m
        for m in services.store.transcripts.all(key)
        if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
    ]


def spawn_of(services: Services, run_id: str) -> dict[str, Any]:
    """The spawn hash of a child run."""
    run = services.store.runs.get(run_id)
    assert run is not None
    found = services.store.spawns.get(str(run.meta["spawnId"]))
    assert found is not None
    return dict(found.fields)


def wait_done(services: Services, run_id: str) -> dict[str, Any]:
    """Wait until a child's spawn finished its announce and cleanup."""
    return wait_until(
        lambda: (r := spawn_of(services, run_id)).get("status") == "done" and r,
        what="the spawn to finish",
    )


def tool_results(services: Services, key: str) -> list[str]:
    """The text of every toolResult in a session's transcript."""
    return [
        str(m["content"][0]["text"])
        for m in services.store.transcripts.all(key)
        if m["role"] == "toolResult"
    ]


def offered(services: Services, key: str) -> set[str]:
    """The tools a session is offered."""
    entry = services.store.sessions.get(key)
    assert entry is not None
    ctx = ToolContext(
        services=services,
        session_key=key,
        agent_id="main",
        spawn_depth=int(entry.get("spawnDepth") or 0),
    )
    return {spec.name for spec in tools_for_session(services, ctx)}


ORCHESTRATION = {"sessions_spawn", "sessions_list", "sessions_history"}


@pytest.mark.parametrize("config_data", [subagents(maxSpawnDepth=2)], indirect=True)
def test_depth_two_tree_leaf_denials_and_announces_one_level_up(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """main → child (orchestrator) → grandchild (leaf): the leaf's calls to the
    orchestration tools find no such tool, its announce lands in the child's session only,
    and the child's announce in main's only."""
    leaf_task = "\n".join(
        [
            "go",
            '/tool sessions_list {"limit": 5}',
            '/tool sessions_history {"sessionKey": "main"}',
            '/tool sessions_spawn {"task": "deeper"}',
            "/reply leaf-result",
        ]
    )
    child_task = "\n".join(
        [
            "go",
            "/tool sessions_spawn " + json.dumps({"task": leaf_task, "label": "leaf"}),
            '/tool sessions_list {"limit": 5}',
            "/reply child-result",
        ]
    )
    top = spawn(client, task=child_task, label="orchestrator")
    assert top["status"] == "accepted"
    child = top["childSessionKey"]
    child_record = wait_done(services, top["runId"])
    [accepted_json, listed_json] = tool_results(services, child)
    accepted = json.loads(accepted_json)
    assert accepted["status"] == "accepted", accepted
    assert json.loads(listed_json).get("status") != "error"  # an orchestrator may list
    leaf = accepted["childSessionKey"]
    assert re.fullmatch(re.escape(child) + ":subagent:" + UUID4, leaf)  # nested key
    leaf_record = wait_done(services, accepted["runId"])

    child_entry = services.store.sessions.get(child)
    leaf_entry = services.store.sessions.get(leaf)
    assert child_entry is not None and leaf_entry is not None
    assert (child_entry.get("spawnDepth"), child_entry.get("subagentRole")) == (1, "orchestrator")
    assert (leaf_entry.get("spawnDepth"), leaf_entry.get("subagentRole")) == (2, "leaf")
    assert leaf_entry.get("spawnedBy") == child and leaf_record["requesterKey"] == child
    assert child_record["requesterKey"] == MAIN

    # The leaf: no orchestration tool, through the model loop and over HTTP.
    denied = tool_results(services, leaf)
    for name in ("sessions_list", "sessions_history", "sessions_spawn"):
        assert any(f"Unknown tool name: '{name}'" in text for text in denied), name
        body = {"tool": name, "args": {}, "sessionKey": leaf}
        resp = client.post("/tools/invoke", json=body)
        assert resp.status_code == 404, (name, resp.text)
    assert leaf_record["outcome"] == "ok" and leaf_record["result"] == "leaf-result"
    assert offered(services, leaf).isdisjoint(ORCHESTRATION)
    assert offered(services, child) >= ORCHESTRATION
    assert services.store.sessions.children(leaf) == []

    # Announces climb one level: the leaf's to the child, the child's to main.
    [to_child] = wait_until(lambda: announces(services, child), what="the leaf's announce")
    assert to_child["provenance"]["sourceSessionKey"] == leaf
    assert "Result: leaf-result" in to_child["content"]
    [to_main] = announces(services, MAIN)
    assert to_main["provenance"]["sourceSessionKey"] == child
    assert "Result: child-result" in to_main["content"]
    assert "leaf-result" not in json.dumps(services.store.transcripts.all(MAIN))


@pytest.mark.parametrize(
    "config_data", [subagents(maxSpawnDepth=2, maxChildrenPerAgent=1)], indirect=True
)
def test_max_children_per_agent_holds_at_each_level(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Each requester session counts its own active children: the child's second spawn
    is refused while its first runs (1/1), as is main's second while the child runs; a
    grandchild never takes main's slot."""
    slow_leaf = json.dumps({"task": "go\n/sleep 2\n/reply g1", "label": "g1"})
    second_leaf = json.dumps({"task": "go\n/reply g2", "label": "g2"})
    child_task = f"go\n/tool sessions_spawn {slow_leaf}\n/tool sessions_spawn {second_leaf}"
    top = spawn(client, task=child_task + "\n/sleep 1\n/reply child")
    assert top["status"] == "accepted"
    child = top["childSessionKey"]
    refused = spawn(client, task="go\n/reply b")
    assert refused == {
        "status": "forbidden",
        "error": "sessions_spawn has reached max active children for this session (1/1; "
        "agents.defaults.subagents.maxChildrenPerAgent).",
    }
    assert services.store.spawns.active_children(MAIN) == [child]
    wait_until(lambda: len(tool_results(services, child)) == 2, what="the child's two calls")
    first, second = (json.loads(text) for text in tool_results(services, child))
    assert first["status"] == "accepted"
    assert second == {
        "status": "forbidden",
        "error": "sessions_spawn has reached max active children for this session (1/1; "
        "agents.defaults.subagents.maxChildrenPerAgent).",
    }
    wait_done(services, top["runId"])
    wait_done(services, first["runId"])
    assert services.store.spawns.active_children(child) == []
    assert services.store.spawns.active_children(MAIN) == []
    again = spawn(client, task="go\n/reply again")
    assert again["status"] == "accepted"
    wait_done(services, again["runId"])


@pytest.mark.parametrize("config_data", [subagents(maxSpawnDepth=2)], indirect=True)
def test_depth_limit_refuses_a_leaf_and_a_grandchild_parent_turn(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A grandchild spawned with completionTarget parent comes back as a private turn of
    the child (a run of the child's session on the announce); the depth check refuses a
    leaf's spawn with OpenClaw's text."""
    leaf = json.dumps({"task": "go\n/reply deep-result", "completionTarget": "parent"})
    top = spawn(client, task=f"go\n/tool sessions_spawn {leaf}\n/reply child-done")
    child = top["childSessionKey"]
    wait_done(services, top["runId"])
    accepted = json.loads(tool_results(services, child)[0])
    leaf_record = wait_done(services, accepted["runId"])
    turn_id = str(leaf_record["announceRunId"])
    turn = wait_until(
        lambda: (r := services.store.runs.get(turn_id)) is not None and r.terminal and r,
        what="the child's private turn",
    )
    assert turn.session_key == child and turn.status == "ok"
    messages = services.store.transcripts.all(child)
    [announce] = announces(services, child)
    assert "Result: deep-result" in announce["content"]
    assert messages[-1]["role"] == "assistant"  # the child's model answered it
    assert len(announces(services, MAIN)) == 1  # only the child's own announce

    spec = services.tools.get("sessions_spawn")
    assert spec is not None
    ctx = ToolContext(
        services=services,
        session_key=str(accepted["childSessionKey"]),
        agent_id="main",
        spawn_depth=2,
    )
    assert spec.handler(ctx, {"task": "deeper"}) == {
        "status": "forbidden",
        "error": "sessions_spawn is not allowed at this depth (current depth: 2, max: 2; "
        "agents.defaults.subagents.maxSpawnDepth).",
    }
