"""`subagents` end to end: list, wait and cancel over /tools/invoke and from an agent run,
on a real api, a real worker and a real Redis."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from switchboard.shared.services import Services

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Sub-agents may nest three levels deep (main → orchestrator → orchestrator → leaf)."""
    return {"agents": {"defaults": {"subagents": {"maxSpawnDepth": 3, "maxChildrenPerAgent": 10}}}}


@pytest.fixture(autouse=True)
def cancel_leftovers(worker: Any, client: httpx.Client, services: Services) -> Iterator[None]:
    """After each test, cancel whatever main's children still run (a failed test must not
    leave runs sleeping into the next one)."""
    yield
    for row in invoke(client, "subagents")["active"]:
        invoke(client, "subagents", action="cancel", runId=row["runId"])
    wait_until(lambda: not services.store.runs.cancel_requests(), what="the leftovers to stop")


def invoke(client: httpx.Client, tool: str, session: str = "main", **args: Any) -> dict[str, Any]:
    """Call a tool over /tools/invoke acting for ``session``; the tool's result."""
    resp = client.post("/tools/invoke", json={"tool": tool, "args": args, "sessionKey": session})
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def spawn(client: httpx.Client, session: str = "main", **args: Any) -> dict[str, Any]:
    """Spawn a child of ``session``; asserts it was accepted."""
    result = invoke(client, "sessions_spawn", session, **args)
    assert result["status"] == "accepted", result
    return result


def wait_until(check: Callable[[], Any], timeout_s: float = 20, what: str = "condition") -> Any:
    """Poll until `check()` is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def status_of(services: Services, run_id: str) -> str:
    """A run's stored status."""
    rec = services.store.runs.get(run_id)
    assert rec is not None
    return rec.status


def running(services: Services, run_id: str) -> bool:
    """The run has been claimed by the worker and is executing."""
    return status_of(services, run_id) == "running"


def spawn_done(services: Services, run_id: str) -> bool:
    """The child's spawn has finished: announced (delivery settled) and cleaned up."""
    rec = services.store.runs.get(run_id)
    spawn = services.store.spawns.get(str(rec.meta["spawnId"])) if rec else None
    return spawn is not None and spawn.get("status") == "done"


def announces(services: Services, key: str = MAIN) -> list[dict[str, Any]]:
    """The sub-agent announces in a session's transcript."""
    return [
        m
        for m in services.store.transcripts.all(key)
        if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
    ]


# -- list ---------------------------------------------------------------------------------


def test_list_shows_active_and_recent_children_with_their_rows(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """A finished child is recent (completed, outcome, delivered announce, timings); a
    sleeping one is active; both carry the row fields; the text names both."""
    done = spawn(client, task="go\n/reply finished", label="quick")
    slow = spawn(client, task="go\n/sleep 30", label="slow one")
    wait_until(lambda: spawn_done(services, done["runId"]), what="the quick child's announce")
    wait_until(lambda: running(services, slow["runId"]), what="the slow child to run")
    listed = invoke(client, "subagents")
    assert {k: listed[k] for k in ("status", "action", "total")} == {
        "status": "ok",
        "action": "list",
        "total": 2,
    }
    assert listed["requesterSessionKey"] == listed["callerSessionKey"] == MAIN
    assert listed["callerIsSubagent"] is False
    [active] = listed["active"]
    assert active["runId"] == slow["runId"]
    assert active["sessionKey"] == slow["childSessionKey"]
    assert (active["label"], active["status"], active["state"]) == (
        "slow one",
        "running",
        "running",
    )
    assert active["deliveryStatus"] == "pending" and "outcome" not in active
    assert "endedAt" not in active and active["startedAt"] > 0
    [recent] = listed["recent"]
    assert recent["runId"] == done["runId"] and recent["label"] == "quick"
    assert (recent["status"], recent["state"]) == ("completed", "succeeded")
    assert recent["outcome"] == {"status": "ok"}
    assert recent["deliveryStatus"] == "delivered"
    assert recent["endedAt"] >= recent["startedAt"] > 0
    assert "active subagents:" in listed["text"] and "slow one" in listed["text"]
    assert "recent (last 30m):" in listed["text"] and "quick" in listed["text"]
    # The model's call (action defaults to list) answers the same through the loop.
    turn = rpc("agent", sessionKey="main", message="/tool subagents {}")
    reply = rpc("agent.wait", runId=turn["runId"], timeoutMs=20_000)["reply"]
    through_loop = json.loads(reply.splitlines()[0])
    assert (through_loop["action"], through_loop["total"]) == ("list", 2)
    assert [r["runId"] for r in through_loop["active"]] == [slow["runId"]]
    # A child's own list is its own (empty) tree.
    own = invoke(client, "subagents", slow["childSessionKey"])
    assert own["callerIsSubagent"] is True and own["total"] == 0
    assert invoke(client, "subagents", action="cancel", runId=slow["runId"])["cancelled"]


# -- wait ---------------------------------------------------------------------------------


def test_wait_returns_completed_as_soon_as_one_run_finishes(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Two runs selected, one ends after ~1 s: the wait answers then, not at its timeout."""
    fast = spawn(client, task="go\n/sleep 1\n/reply fast")
    slow = spawn(client, task="go\n/sleep 30")
    started = time.monotonic()
    waited = invoke(
        client, "subagents", action="wait", runIds=[slow["runId"], fast["runId"]], timeoutSeconds=30
    )
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"the wait took {elapsed:.1f}s"
    assert (waited["status"], waited["action"], waited["reason"]) == ("ok", "wait", "completed")
    assert waited["completed"] == [fast["runId"]] and waited["attention"] == []
    assert "unavailable" not in waited
    rows = {row["runId"]: row for row in waited["runs"]}
    assert rows[fast["runId"]]["state"] == "succeeded"
    assert rows[slow["runId"]]["state"] in ("queued", "running")
    invoke(client, "subagents", action="cancel", runId=slow["runId"])


def test_wait_times_out_without_cancelling_or_taking_the_announce(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """At its timeout the wait answers `timeout`; the run goes on and announces itself."""
    child = spawn(client, task="go\n/sleep 3\n/reply late result")
    started = time.monotonic()
    waited = invoke(client, "subagents", action="wait", runIds=[child["runId"]], timeoutSeconds=1)
    assert 0.9 <= time.monotonic() - started < 5
    assert waited["reason"] == "timeout" and waited["completed"] == []
    assert status_of(services, child["runId"]) in ("queued", "running")
    wait_until(lambda: announces(services), what="the child's own announce")
    assert status_of(services, child["runId"]) == "ok"
    assert "Result: late result" in announces(services)[0]["content"]
    snapshot = invoke(client, "subagents", action="wait", runIds=[child["runId"]], timeoutSeconds=0)
    assert (snapshot["reason"], snapshot["completed"]) == ("completed", [child["runId"]])


def test_wait_refuses_bad_selections(worker: Any, client: httpx.Client) -> None:
    """Runs outside the caller's tree are unavailable at once; more than 32 are refused."""
    other = spawn(client, session="agent:main:other", task="go\n/reply other's")
    waited = invoke(client, "subagents", action="wait", runIds=[other["runId"], "nope"])
    assert waited["reason"] == "unavailable"
    assert waited["unavailable"] == [other["runId"], "nope"] and waited["runs"] == []
    many = [f"run-{n}" for n in range(33)]
    assert invoke(client, "subagents", action="wait", taskIds=many) == {
        "status": "error",
        "action": "wait",
        "error": "subagents wait supports at most 32 taskIds.",
    }
    assert invoke(client, "subagents", action="wait")["error"] == "taskIds required"
    assert invoke(client, "subagents", action="steer")["error"] == "Unsupported action."


def test_wait_inside_an_agent_run_parks_the_run(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """The model calls `subagents wait`: its run is parked (no worker slot) until the child
    ends, then the tool answers `completed`."""
    child = spawn(client, task="go\n/sleep 2\n/reply child done")
    args = json.dumps({"action": "wait", "runIds": [child["runId"]], "timeoutSeconds": 30})
    parent = rpc("agent", sessionKey="main", message=f"/tool subagents {args}")
    wait_until(lambda: status_of(services, parent["runId"]) == "parked", what="the parked wait")
    assert status_of(services, child["runId"]) in ("queued", "running")
    outcome = rpc("agent.wait", runId=parent["runId"], timeoutMs=20_000)
    assert outcome["status"] == "ok", outcome
    result = json.loads(outcome["reply"].splitlines()[0])
    assert (result["action"], result["reason"]) == ("wait", "completed")
    assert result["completed"] == [child["runId"]]
    # The child's announce lands after the parent's turn, not between its call and result.
    wait_until(lambda: announces(services), what="the announce")
    roles = [m["role"] for m in services.store.transcripts.all(MAIN)]
    assert roles == ["user", "assistant", "toolResult", "assistant", "user"]


# -- cancel -------------------------------------------------------------------------------


def _three_levels(client: httpx.Client, services: Services) -> list[dict[str, Any]]:
    """main → orchestrator → orchestrator → leaf, each sleeping in its model call."""
    top = spawn(client, task="go\n/sleep 60", label="grandparent")
    middle = spawn(client, session=top["childSessionKey"], task="go\n/sleep 60", label="parent")
    leaf = spawn(client, session=middle["childSessionKey"], task="go\n/sleep 60", label="leaf")
    levels = [top, middle, leaf]
    for level in levels:
        wait_until(lambda level=level: running(services, level["runId"]), what="every level to run")
    return levels


def test_cancel_of_a_grandparent_cancels_two_levels_below(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Cancel the top run: its model call and its descendants' are stopped, every run ends
    `cancelled`, none is left running, and main hears of it once."""
    top, middle, leaf = _three_levels(client, services)
    result = invoke(client, "subagents", action="cancel", runId=top["runId"])
    assert (result["status"], result["action"], result["runId"]) == (
        "cancelled",
        "cancel",
        top["runId"],
    )
    assert (result["found"], result["cancelled"], result["cascadeCancelled"]) == (True, True, 2)
    assert result["cascadeLabels"] == ["parent", "leaf"]
    ids = [top["runId"], middle["runId"], leaf["runId"]]
    wait_until(
        lambda: all(status_of(services, r) == "cancelled" for r in ids),
        timeout_s=10,
        what="every level to be cancelled",
    )
    assert services.store.runs.cancel_requests() == set()
    waited = invoke(client, "subagents", action="wait", runIds=ids, timeoutSeconds=0)
    assert {row["state"] for row in waited["runs"]} == {"cancelled"}
    assert waited["reason"] == "completed" and sorted(waited["completed"]) == sorted(ids)
    for run_id in ids:
        rec = services.store.runs.get(run_id)
        assert rec is not None and rec.ended_at_ms is not None and rec.error
    wait_until(lambda: announces(services), what="main's announce")
    time.sleep(0.5)
    [told] = announces(services)
    assert "Status: cancelled" in told["content"]
    listed = invoke(client, "subagents")
    assert listed["active"] == [] and listed["recent"][0]["state"] == "cancelled"
    again = invoke(client, "subagents", action="cancel", runId=top["runId"])
    assert (again["status"], again["found"], again["cancelled"]) == ("error", True, False)
    assert again["reason"] == "task already ended (cancelled)"


def test_cancel_from_an_agent_run_stops_a_queued_child_without_running_it(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """A child queued behind its session's lane ends `cancelled` without running; the
    model's cancel call answers through the loop."""
    child = spawn(client, task="go\n/sleep 60", label="busy")
    wait_until(lambda: running(services, child["runId"]), what="the child to run")
    queued = rpc("agent", sessionKey=child["childSessionKey"], message="/reply never")
    assert status_of(services, queued["runId"]) == "queued"
    args = json.dumps({"action": "cancel", "runId": child["runId"]})
    parent = rpc("agent", sessionKey="main", message=f"/tool subagents {args}")
    outcome = rpc("agent.wait", runId=parent["runId"], timeoutMs=20_000)
    result = json.loads(outcome["reply"].splitlines()[0])
    assert (result["status"], result["runId"]) == ("cancelled", child["runId"])
    wait_until(lambda: status_of(services, child["runId"]) == "cancelled", what="the cancel")
    rec = services.store.runs.get(queued["runId"])
    assert rec is not None and rec.status == "cancelled" and rec.started_at_ms is None
    assert services.store.runs.lane_holder(child["childSessionKey"]) is None


def test_cancel_outside_the_callers_tree_is_refused(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A sibling's child, or an unknown run, is not the caller's to cancel."""
    mine = spawn(client, task="go\n/sleep 30")
    sibling = spawn(client, task="go\n/sleep 30")
    wait_until(lambda: running(services, sibling["runId"]), what="the sibling to run")
    refused = invoke(
        client, "subagents", mine["childSessionKey"], action="cancel", runId=sibling["runId"]
    )
    assert refused == {
        "status": "error",
        "action": "cancel",
        "taskId": sibling["runId"],
        "runId": sibling["runId"],
        "found": False,
        "cancelled": False,
        "reason": "Task outside session tree.",
        "error": "Task outside session tree.",
    }
    unknown = invoke(client, "subagents", action="cancel", taskId="no-such-run")
    assert (unknown["status"], unknown["taskId"], unknown["found"]) == (
        "error",
        "no-such-run",
        False,
    )
    assert status_of(services, sibling["runId"]) == "running"
    for run in (mine, sibling):
        invoke(client, "subagents", action="cancel", runId=run["runId"])


def test_a_yielded_child_is_waiting_not_completed(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A child that spawned its own child and yielded shows `waiting`; a wait on it does
    not count it completed (it times out) until its own child's result has woken it and
    that turn ended."""
    grandchild = json.dumps({"task": "go\n/sleep 3\n/reply deep result"})
    child = spawn(client, task=f"go\n/tool sessions_spawn {grandchild}\n/tool sessions_yield {{}}")
    key = child["childSessionKey"]
    wait_until(lambda: (e := services.store.sessions.get(key)) and e.get("yieldedAt"), what="yield")
    [row] = invoke(client, "subagents")["active"]
    assert (row["runId"], row["status"]) == (child["runId"], "waiting")
    waited = invoke(client, "subagents", action="wait", runIds=[child["runId"]], timeoutSeconds=1)
    assert (waited["reason"], waited["completed"]) == ("timeout", [])
    waited = invoke(client, "subagents", action="wait", runIds=[child["runId"]], timeoutSeconds=30)
    assert (waited["reason"], waited["completed"]) == ("completed", [child["runId"]])
    assert waited["runs"][0]["status"] == "completed"


def test_cancel_of_a_yielded_child_ends_it_cancelled_and_tells_the_parent_once(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A child that yielded waiting for its own child: cancel stops the grandchild and
    ends the child's paused turn `cancelled`; main hears of it once, and nothing runs on."""
    grandchild = json.dumps({"task": "go\n/sleep 60", "label": "deep"})
    child = spawn(client, task=f"go\n/tool sessions_spawn {grandchild}\n/tool sessions_yield {{}}")
    key = child["childSessionKey"]
    wait_until(lambda: (e := services.store.sessions.get(key)) and e.get("yieldedAt"), what="yield")
    [deep] = services.store.spawns.get_many(services.store.spawns.spawn_ids_of(key))
    assert deep is not None
    deep_run = str(deep["runId"])
    wait_until(lambda: running(services, deep_run), what="the grandchild to run")
    result = invoke(client, "subagents", action="cancel", runId=child["runId"])
    assert (result["status"], result["cascadeCancelled"]) == ("cancelled", 1)
    wait_until(lambda: status_of(services, deep_run) == "cancelled", what="the grandchild")
    [row] = wait_until(lambda: invoke(client, "subagents")["recent"], what="the child to end")
    assert (row["runId"], row["state"], row["status"]) == (child["runId"], "cancelled", "cancelled")
    [told] = wait_until(lambda: announces(services), what="main's announce")
    assert "Status: cancelled" in told["content"]
    time.sleep(1)
    assert len(announces(services)) == 1
    assert services.store.runs.lane_holder(key) is None
    entry = services.store.sessions.get(key)
    assert entry is not None and not entry.get("yieldedAt")


def test_task_ids_name_runs_in_list_wait_and_cancel(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """OpenClaw 2026.9.6's ids: list has taskTotal and tasks[] rows with taskId, wait takes
    taskIds, cancel takes taskId and answers {status, taskId, found, cancelled}, over
    /tools/invoke and from the model loop."""
    done = spawn(client, task="go\n/reply finished")
    slow = spawn(client, task="go\n/sleep 30")
    wait_until(lambda: spawn_done(services, done["runId"]), what="the quick child's announce")
    listed = invoke(client, "subagents")
    assert listed["taskTotal"] == 2
    assert {t["taskId"] for t in listed["tasks"]} == {done["runId"], slow["runId"]}
    assert all(t["taskId"] == t["runId"] for t in listed["tasks"])
    waited = invoke(client, "subagents", action="wait", taskIds=[done["runId"]], timeoutSeconds=0)
    assert (waited["reason"], waited["completed"]) == ("completed", [done["runId"]])
    args = json.dumps({"action": "cancel", "taskId": slow["runId"]})
    turn = rpc("agent", sessionKey="main", message=f"/tool subagents {args}")
    reply = rpc("agent.wait", runId=turn["runId"], timeoutMs=20_000)["reply"]
    cancelled = json.loads(reply.splitlines()[0])
    assert {k: cancelled[k] for k in ("status", "taskId", "found", "cancelled")} == {
        "status": "cancelled",
        "taskId": slow["runId"],
        "found": True,
        "cancelled": True,
    }
    wait_until(lambda: status_of(services, slow["runId"]) == "cancelled", what="the cancel")


def test_delivery_status_uses_the_openclaw_vocabulary(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """ANNOUNCE_SKIP is `dismissed`, a fire-and-forget child `not_applicable`, an announced
    one `delivered`, over /tools/invoke and from the model loop."""
    skipped = spawn(client, task="go\n/reply ANNOUNCE_SKIP")
    silent = spawn(client, task="go\n/reply x", expectsCompletionMessage=False)
    told = spawn(client, task="go\n/reply y")
    for run in (skipped, silent, told):
        wait_until(lambda run=run: spawn_done(services, run["runId"]), what="the spawns")
    expected = {
        skipped["runId"]: "dismissed",
        silent["runId"]: "not_applicable",
        told["runId"]: "delivered",
    }
    listed = invoke(client, "subagents")
    assert {t["taskId"]: t["deliveryStatus"] for t in listed["tasks"]} == expected
    turn = rpc("agent", sessionKey="main", message="/tool subagents {}")
    reply = rpc("agent.wait", runId=turn["runId"], timeoutMs=20_000)["reply"]
    through_loop = json.loads(reply.splitlines()[0])
    assert {t["taskId"]: t["deliveryStatus"] for t in through_loop["tasks"]} == expected
    # The console's spawn tree reads the same statuses from the gateway's sessions.list.
    rows = rpc("sessions.list", spawnedBy="main", limit=10)["sessions"]
    keys = {r["childSessionKey"]: r["runId"] for r in (skipped, silent, told)}
    assert {expected[keys[row["key"]]] for row in rows} == set(expected.values())
    assert all(row["deliveryStatus"] == expected[keys[row["key"]]] for row in rows)
