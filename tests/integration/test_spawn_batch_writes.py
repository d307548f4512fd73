"""Batch `sessions_spawn` writes its children in pipelined chunks: what each chunk records.

The tool handler runs in process against the private Redis; the runs it queues go to the
real broker (read back from the queue), or to the real worker where a test needs the
whole flow.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from switchboard.shared.flows import spawn as spawn_flow
from switchboard.shared.policy.send_policy import SEND_BLOCKED
from switchboard.shared.services import Services
from switchboard.shared.tools.registry import ToolContext
from switchboard.shared.tools.sessions_spawn import sessions_spawn
from switchboard.workers.app import RUNS_QUEUE
from switchboard.workers.queue import RUNS_PER_MESSAGE

pytestmark = pytest.mark.integration

REQUESTER = "agent:main:main"


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Room for a batch of 150."""
    return {"agents": {"defaults": {"subagents": {"maxChildrenPerAgent": 200}}}}


def call_spawn(services: Services, **args: Any) -> dict[str, Any]:
    """The tool as the requester's run calls it."""
    return sessions_spawn(
        ToolContext(services=services, session_key=REQUESTER, agent_id="main"), args
    )


def queued_runs(services: Services) -> list[tuple[str, list[str], str]]:
    """(task, args, argsrepr) of every message waiting in the runs queue, oldest first."""
    out = []
    for raw in reversed(services.store.redis.lrange(RUNS_QUEUE, 0, -1)):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        headers = message["headers"]
        out.append((headers["task"], args, headers["argsrepr"]))
    return out


def wait_until(check: Callable[[], Any], timeout_s: float = 60, what: str = "condition") -> Any:
    """Poll until `check()` is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def test_a_batch_records_every_child_and_queues_every_run(services: Services) -> None:
    """150 children (two chunks): spawn record naming its run, session with lineage and
    label, run holding its lane, every run queued once (20 to a message), children listed
    in order; a
    label another session holds stays on the spawn record only."""
    services.store.sessions.ensure("agent:main:other")
    services.store.sessions.patch("agent:main:other", {"label": "child-7"})
    tasks = [{"task": f"task {i}", "label": f"child-{i}"} for i in range(150)]
    result = call_spawn(services, tasks=tasks, join="each")
    assert result["status"] == "accepted" and len(result["runs"]) == 150
    runs = result["runs"]
    assert [r["label"] for r in runs] == [f"child-{i}" for i in range(150)]
    keys = [r["childSessionKey"] for r in runs]
    assert services.store.sessions.children(REQUESTER) == keys
    records = services.store.spawns
    assert sorted(records.active_children(REQUESTER)) == sorted(keys)
    entries = services.store.sessions.get_many(keys)
    for index, (run, entry) in enumerate(zip(runs, entries, strict=True)):
        assert entry is not None
        assert entry.get("spawnedBy") == REQUESTER and entry.get("spawnDepth") == 1
        spawn = records.get(str(entry.get("spawnId")))
        assert spawn is not None
        assert spawn.get("runId") == run["runId"] and spawn.get("status") == "running"
        assert spawn.get("batchId") == result["batchId"] and spawn.get("batchIndex") == index
        assert spawn.get("label") == f"child-{index}"
        rec = services.store.runs.get(run["runId"])
        assert rec is not None and rec.status == "queued" and rec.kind == "subagent"
        assert rec.on_end == {"task": "switchboard.subagent_announce", "args": [spawn.id]}
        assert (
            rec.message is not None and f"[Subagent Task]: task {index}" in rec.message["content"]
        )
        assert services.store.runs.lane_holder(run["childSessionKey"]) == run["runId"]
    labels = [entry.get("label") if entry else None for entry in entries]
    assert labels[7] is None  # held by agent:main:other
    assert labels[:7] + labels[8:] == [f"child-{i}" for i in range(150) if i != 7]
    assert services.store.sessions.key_for_label("child-7") == "agent:main:other"
    # 20 runs to a message (`switchboard.runs`), every run once, in order.
    queued = queued_runs(services)
    assert [task for task, _, _ in queued] == ["switchboard.runs"] * 8
    assert [len(args[0]) for _, args, _ in queued] == [RUNS_PER_MESSAGE] * 7 + [10]
    pairs = [pair for _, args, _ in queued for pair in args[0]]
    assert pairs == [[r["runId"], r["childSessionKey"]] for r in runs]
    assert all(argsrepr.startswith(f"[{len(args[0])} runs: ") for _, args, argsrepr in queued)


@pytest.mark.parametrize(
    "config_data",
    [
        {
            "session": {
                "sendPolicy": {
                    "rules": [{"action": "deny", "match": {"rawKeyPrefix": "agent:main:subagent:"}}]
                }
            }
        }
    ],
)
def test_children_whose_send_policy_denies_end_as_errors_at_once(services: Services) -> None:
    """Denied children start no run and leave no session; each member is an error and the
    requester's slots are free again."""
    result = call_spawn(services, tasks=["one", {"task": "two", "label": "b"}])
    assert result["status"] == "accepted"
    assert [(r["status"], r["error"]) for r in result["runs"]] == [("error", SEND_BLOCKED)] * 2
    assert result["runs"][1]["label"] == "b"
    for run in result["runs"]:
        assert not services.store.sessions.exists(run["childSessionKey"])
    records = services.store.spawns
    assert records.active_children(REQUESTER) == []
    batch = records.get_batch(result["batchId"])
    assert batch is not None
    spawns = [records.get(sid) for sid in batch["spawnIds"]]
    assert [(s.get("outcome"), s.get("status")) for s in spawns if s] == [("error", "done")] * 2
    assert queued_runs(services) == []


def test_a_batch_over_several_chunks_announces_every_child_once(
    worker: Any, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 3: ten children run and each announces exactly once, then is finished."""
    monkeypatch.setattr(spawn_flow, "_CHUNK", 3)
    tasks = [{"task": f"go\n/reply result {i}", "label": f"c{i}"} for i in range(10)]
    result = call_spawn(services, tasks=tasks)
    records = services.store.spawns

    def announced() -> list[str]:
        return [
            str(m["content"])
            for m in services.store.transcripts.all(REQUESTER)
            if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
        ]

    texts = wait_until(lambda: len(announced()) >= 10 and announced(), what="ten announces")
    assert sorted(t.splitlines()[0] for t in texts) == sorted(
        f'A subagent task "c{i}" just completed successfully.' for i in range(10)
    )
    assert all(any(f"Result: result {i}" in t for t in texts) for i in range(10))
    batch = records.get_batch(result["batchId"])
    assert batch is not None
    wait_until(
        lambda: all(
            s is not None and s.get("status") == "done" and s.get("announce") == "delivered"
            for s in records.get_many(batch["spawnIds"])
        ),
        what="every spawn to finish",
    )
    assert records.active_children(REQUESTER) == []
    assert records.done_count(result["batchId"]) == 10
    time.sleep(0.5)
    assert len(announced()) == 10


def test_the_childrens_outbox_entries_are_cleared(worker: Any, services: Services) -> None:
    """Forty children followed up in place: every outbox entry their runs' ends filed is
    cleared (none is left for the sweep)."""
    tasks = [{"task": f"go\n/reply r{i}", "label": f"o{i}"} for i in range(40)]
    result = call_spawn(services, tasks=tasks)
    records = services.store.spawns
    batch = records.get_batch(result["batchId"])
    assert batch is not None
    spawns = wait_until(
        lambda: (
            (found := records.get_many(batch["spawnIds"]))
            and all(s is not None and s.get("status") == "done" for s in found)
            and found
        ),
        what="every child to finish",
    )
    run_ids = {str(s["runId"]) for s in spawns if s is not None}
    assert len(run_ids) == 40
    far = int(time.time() * 1000) + 3_600_000
    wait_until(
        lambda: not run_ids & set(services.store.runs.outbox_due(far, limit=10_000)),
        timeout_s=10,
        what="the outbox entries to be cleared",
    )
