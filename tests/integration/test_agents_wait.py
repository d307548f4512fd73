"""Collector spawns and `agents_wait` end to end: real api, real worker, real Redis.

Children run on the offline echo model: a task's `/sleep` and `/reply` lines say how long
the child takes and what it answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from switchboard.shared.flows.collect import NOT_JSON
from switchboard.shared.services import Services
from switchboard.shared.tools.collect_spawn import NOTE as COLLECT_NOTE

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
}


@pytest.fixture
def config_data(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Room for a 200-child group, or a test's own `tools.swarm` (indirect)."""
    swarm = getattr(request, "param", {"maxChildrenPerGroup": 500, "maxTotalPerGroup": 1000})
    return {"tools": {"swarm": {"enabled": True, **swarm}}}


def invoke(client: httpx.Client, tool: str, session: str = "main", **args: Any) -> httpx.Response:
    """POST /tools/invoke acting for ``session``."""
    return client.post("/tools/invoke", json={"tool": tool, "args": args, "sessionKey": session})


def result(client: httpx.Client, tool: str, session: str = "main", **args: Any) -> Any:
    """The tool's result (asserting HTTP 200)."""
    resp = invoke(client, tool, session, **args)
    assert resp.status_code == 200, resp.text
    return resp.json()["result"]


def spawn_collectors(client: httpx.Client, tasks: list[str], **args: Any) -> list[str]:
    """One batch spawn of collector children; their run ids, in task order."""
    out = result(client, "sessions_spawn", tasks=[{"task": t} for t in tasks], collect=True, **args)
    assert out["status"] == "accepted", out
    return [run["runId"] for run in out["runs"]]


def wait_until(check: Callable[[], Any], timeout_s: float = 30, what: str = "it") -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


# -- draining a fan-out ---------------------------------------------------------------


def test_drains_200_children_in_completion_order_over_several_calls(
    client: httpx.Client, services: Services, worker: Any
) -> None:
    """Partial answers on a short timeout; every child once; the order of completion."""
    tasks = [f"child {i}\n/sleep {0.05 * (i % 10):.2f}\n/reply answer {i}" for i in range(200)]
    ids = spawn_collectors(client, tasks)
    assert len(set(ids)) == 200

    snapshot = result(client, "agents_wait", ids=ids, timeoutSeconds=0)
    assert "errors" not in snapshot
    assert len(snapshot["completed"]) + len(snapshot["pending"]) == 200

    collected: list[dict[str, Any]] = list(snapshot["completed"])
    pending = snapshot["pending"]
    calls, partial = 1, 0
    while pending:
        calls += 1
        assert calls < 400, "the drain does not end"
        out = result(client, "agents_wait", ids=pending, timeoutSeconds=0.3)
        assert set(out["pending"]) <= set(pending)
        assert {c["runId"] for c in out["completed"]} | set(out["pending"]) == set(pending)
        partial += bool(out["pending"])
        collected += out["completed"]
        pending = out["pending"]
    assert partial >= 2, "expected several partial answers"
    assert sorted(c["runId"] for c in collected) == sorted(ids)
    by_run = {run_id: i for i, run_id in enumerate(ids)}
    for item in collected:
        assert item["status"] == "done"
        assert item["result"] == f"answer {by_run[item['runId']]}"
        assert item["sessionKey"].startswith("agent:main:subagent:")
        assert item["usage"]["outputTokens"] == 2
        assert "structured" not in item and "schemaError" not in item
    # Completion order: the requester's completion log, across all the calls.
    assert [c["runId"] for c in collected] == services.store.collect.log(MAIN)
    # Completed records answer the same when asked again; nothing is announced.
    again = result(client, "agents_wait", ids=ids[:3], timeoutSeconds=0)
    assert [c["runId"] for c in again["completed"]] == sorted(
        ids[:3], key=[c["runId"] for c in collected].index
    )
    assert again["pending"] == []
    announces = [
        m
        for m in services.store.transcripts.all(MAIN)
        if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
    ]
    assert announces == []


def test_returns_at_the_first_completion_not_the_timeout(client: httpx.Client, worker: Any) -> None:
    ids = spawn_collectors(client, ["slow\n/sleep 1\n/reply first", "slower\n/sleep 20\n/reply x"])
    t0 = time.monotonic()
    out = result(client, "agents_wait", ids=ids, timeoutSeconds=30)
    elapsed = time.monotonic() - t0
    assert [c["result"] for c in out["completed"]] == ["first"]
    assert out["pending"] == [ids[1]]
    assert 0.5 < elapsed < 10, elapsed


def test_times_out_with_everything_pending(client: httpx.Client, worker: Any) -> None:
    ids = spawn_collectors(client, ["slow\n/sleep 20\n/reply late"])
    t0 = time.monotonic()
    out = result(client, "agents_wait", ids=ids, timeoutSeconds=0.5)
    assert 0.4 < time.monotonic() - t0 < 5
    assert out == {"completed": [], "pending": ids}


def test_required_waits_for_all(client: httpx.Client, worker: Any) -> None:
    """`required: true` answers once every id has completed (no timeoutSeconds with it)."""
    ids = spawn_collectors(client, [f"c{i}\n/sleep {0.5 * (i + 1)}\n/reply r{i}" for i in range(3)])
    t0 = time.monotonic()
    out = result(client, "agents_wait", ids=ids, required=True)
    assert time.monotonic() - t0 > 1.2
    assert [c["result"] for c in out["completed"]] == ["r0", "r1", "r2"]
    assert out["pending"] == []
    both = invoke(client, "agents_wait", ids=ids, required=True, timeoutSeconds=5)
    assert both.status_code == 400
    message = both.json()["error"]["message"]
    assert message == "required agents_wait cannot also specify timeoutSeconds."


# -- outputSchema -----------------------------------------------------------------------


def test_output_schema_gives_structured_or_schema_error(client: httpx.Client, worker: Any) -> None:
    replies = {
        "plain": '/reply {"n": 3}',
        "fenced": '/reply Here it is:\n/reply ```json\n/reply {"n": 4}\n/reply ```',
        "wrong type": '/reply {"n": "four"}',
        "missing": '/reply {"m": 1}',
        "prose": "/reply four, I think",
    }
    ids = spawn_collectors(
        client, [f"{name}\n{reply}" for name, reply in replies.items()], outputSchema=SCHEMA
    )
    items: dict[str, dict[str, Any]] = {}
    pending = ids
    while pending:
        out = result(client, "agents_wait", ids=pending, timeoutSeconds=10)
        items.update({c["runId"]: c for c in out["completed"]})
        pending = out["pending"]
    plain, fenced, wrong, missing, prose = (items[i] for i in ids)
    assert plain["structured"] == {"n": 3} and "schemaError" not in plain
    assert plain["result"] == '{"n": 3}'
    assert fenced["structured"] == {"n": 4}
    assert "```json" in fenced["result"]
    assert "structured" not in wrong
    assert wrong["schemaError"] == "'four' is not of type 'integer' (at n)"
    assert wrong["result"] == '{"n": "four"}'
    assert missing["schemaError"] == "'n' is a required property"
    assert prose["schemaError"] == NOT_JSON and prose["result"] == "four, I think"
    assert all(item["status"] == "done" for item in items.values())


def test_a_collector_is_told_how_its_result_is_collected(
    client: httpx.Client, services: Services, worker: Any
) -> None:
    out = result(client, "sessions_spawn", task="x\n/reply {}", collect=True, outputSchema=SCHEMA)
    assert out["status"] == "accepted" and out["note"] == COLLECT_NOTE
    run = services.store.runs.get(out["runId"])
    assert run is not None and run.extra_system_prompt is not None
    assert "## Collected result" in run.extra_system_prompt
    assert '"required": [\n    "n"\n  ]' in run.extra_system_prompt  # the schema itself
    plain = result(client, "sessions_spawn", task="y\n/reply ok")
    assert "agents_wait" not in plain["note"]


def test_spawn_checks_the_collector_parameters(client: httpx.Client, worker: Any) -> None:
    bad_schema = invoke(client, "sessions_spawn", task="x", collect=True, outputSchema={"type": 7})
    assert bad_schema.status_code == 400
    assert "outputSchema is not a valid JSON Schema" in bad_schema.text
    no_collect = invoke(client, "sessions_spawn", task="x", outputSchema=SCHEMA)
    assert no_collect.status_code == 400
    assert "outputSchema requires collect: true" in no_collect.text
    group = invoke(client, "sessions_spawn", task="x", groupId="g")
    assert group.status_code == 400 and "groupId requires collect: true" in group.text
    entry = invoke(client, "sessions_spawn", tasks=[{"task": "x", "collect": True}])
    assert entry.status_code == 400 and "apply to the whole batch" in entry.text


# -- ownership ----------------------------------------------------------------------------


def test_only_the_requester_may_wait(
    client: httpx.Client, rpc: Callable[..., Any], worker: Any
) -> None:
    ids = spawn_collectors(client, ["quick\n/reply mine"])
    started = rpc("agent", sessionKey="other", message="hello")
    assert rpc("agent.wait", runId=started["runId"], timeoutMs=10_000)["status"] == "ok"

    foreign = result(client, "agents_wait", "other", ids=[ids[0], "no-such-run"], timeoutSeconds=1)
    assert foreign == {
        "completed": [],
        "pending": [],
        "errors": [
            {"runId": ids[0], "error": "not_found"},  # as unknown as the next
            {"runId": "no-such-run", "error": "not_found"},
        ],
        "success": False,
    }
    # The requester mixes its own id with an unknown one: no success flag.
    mine = result(client, "agents_wait", ids=[ids[0], "no such run", ids[0]], timeoutSeconds=10)
    assert [c["result"] for c in mine["completed"]] == ["mine"]
    assert mine["errors"] == [{"runId": "no such run", "error": "not_found"}]
    assert "success" not in mine
    # An ordinary (announcing) child is not a collector.
    plain = result(client, "sessions_spawn", task="plain\n/reply hi")
    out = result(client, "agents_wait", ids=[plain["runId"]], timeoutSeconds=0)
    assert out["errors"] == [{"runId": plain["runId"], "error": "not_found"}]


def test_bad_ids_are_refused(client: httpx.Client, worker: Any) -> None:
    assert invoke(client, "agents_wait", ids=[]).status_code == 400
    assert invoke(client, "agents_wait", ids="abc").status_code == 400
    too_many = invoke(client, "agents_wait", ids=[f"r{i}" for i in range(1001)])
    assert too_many.status_code == 400 and "at most 1000" in too_many.text
    # 1,000 unknown ids are answered in one read.
    out = result(client, "agents_wait", ids=[f"r{i}" for i in range(1000)], timeoutSeconds=5)
    assert out["success"] is False and len(out["errors"]) == 1000


# -- caps and the switch -------------------------------------------------------------------


@pytest.mark.parametrize(
    "config_data", [{"maxChildrenPerGroup": 2, "maxTotalPerGroup": 3}], indirect=True
)
def test_group_caps_refuse_naming_the_config_key(client: httpx.Client, worker: Any) -> None:
    first = [
        result(
            client, "sessions_spawn", task=f"{i}\n/sleep 1\n/reply {i}", collect=True, groupId="g"
        )
        for i in range(2)
    ]
    assert all(r["status"] == "accepted" for r in first)
    over = result(client, "sessions_spawn", task="x", collect=True, groupId="g")
    assert over == {
        "status": "forbidden",
        "error": "sessions_spawn reached tools.swarm.maxChildrenPerGroup (2/2).",
    }
    other_group = result(client, "sessions_spawn", task="y\n/reply y", collect=True, groupId="h")
    assert other_group["status"] == "accepted"
    pending = [r["runId"] for r in first]
    while pending:
        pending = result(client, "agents_wait", ids=pending, timeoutSeconds=10)["pending"]
    third = result(client, "sessions_spawn", task="z\n/reply z", collect=True, groupId="g")
    assert third["status"] == "accepted"
    fourth = result(client, "sessions_spawn", task="w", collect=True, groupId="g")
    assert fourth["error"] == "sessions_spawn reached tools.swarm.maxTotalPerGroup (3/3)."


@pytest.mark.parametrize("config_data", [{"enabled": False}], indirect=True)
def test_swarm_switched_off(client: httpx.Client, worker: Any) -> None:
    resp = invoke(client, "sessions_spawn", task="x", collect=True)
    assert resp.status_code == 400
    message = resp.json()["error"]["message"]
    assert message == 'sessions_spawn parameter "collect" requires tools.swarm.enabled=true.'
    assert invoke(client, "agents_wait", ids=["x"]).status_code == 404


# -- inside an agent run ----------------------------------------------------------------------


def test_model_loop_parks_then_collects(
    client: httpx.Client, rpc: Callable[..., Any], services: Services, worker: Any
) -> None:
    """A run calling agents_wait is parked (no worker slot) and resumed by the first
    completion; a second call in the same run collects the rest."""
    ids = spawn_collectors(
        client,
        ['fast\n/sleep 1\n/reply {"n": 1}', 'slow\n/sleep 2.5\n/reply {"n": 2}'],
        outputSchema=SCHEMA,
    )
    call = json.dumps({"ids": ids, "timeoutSeconds": 20})
    started = rpc("agent", sessionKey="main", message=f"/tool agents_wait {call}")
    run_id = started["runId"]
    wait_until(
        lambda: (r := services.store.runs.get(run_id)) is not None and r.status == "parked",
        what="the run to park",
    )
    ended = rpc("agent.wait", runId=run_id, timeoutMs=20_000)
    assert ended["status"] == "ok", ended
    answer = json.loads(ended["reply"])
    assert [c["runId"] for c in answer["completed"]] == [ids[0]]
    assert answer["completed"][0]["structured"] == {"n": 1}
    assert answer["pending"] == [ids[1]]

    call = json.dumps({"ids": answer["pending"], "timeoutSeconds": 20})
    second = rpc("agent", sessionKey="main", message=f"/tool agents_wait {call}")
    ended = rpc("agent.wait", runId=second["runId"], timeoutMs=20_000)
    answer = json.loads(ended["reply"])
    assert [c["structured"] for c in answer["completed"]] == [{"n": 2}]
    assert answer["pending"] == []
