"""kill -9 of the worker while a run waits in `agents_wait` on collector children that
are executing: nothing is lost. The children run again on a new worker and complete once
each; the parked run is resumed by the first completion; the rest are collected after.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from faultkit import Cluster, wait_until

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import ToolContext
from switchboard.shared.tools import agents_wait, sessions_spawn

pytestmark = pytest.mark.faults

PARENT = "agent:main:hook:collector-parent"


@pytest.fixture
def extra_config() -> dict[str, Any]:
    """Collector spawns on (whatever the default)."""
    return {"tools": {"swarm": {"enabled": True}}}


CHILDREN = 8


def test_kill_9_during_a_wait_loses_nothing(cluster: Cluster) -> None:
    first = cluster.worker(concurrency=16)
    svc = cluster.services
    ctx = ToolContext(services=svc, session_key=PARENT, agent_id="main")
    tasks = [
        {"task": f"child {i}\n/sleep {3 + i * 0.2:.1f}\n/reply answer {i}"} for i in range(CHILDREN)
    ]
    spawned = sessions_spawn.sessions_spawn(ctx, {"tasks": tasks, "collect": True})
    assert spawned["status"] == "accepted", spawned
    ids = [r["runId"] for r in spawned["runs"]]
    call = json.dumps({"ids": ids, "timeoutSeconds": 120})
    waiting = str(
        start_run(svc, RunRequest(session_key=PARENT, message=f"/tool agents_wait {call}"))["runId"]
    )

    def parked_with_children_running() -> bool:
        parent = svc.store.runs.get(waiting)
        children = [c for c in svc.store.runs.get_many(ids) if c is not None]
        return (
            parent is not None
            and parent.status == "parked"
            and any(c.status == "running" for c in children)
        )

    wait_until(parked_with_children_running, 60, "the wait to park with children running")
    assert all(svc.store.collect.get(i).get("completedSeq") is None for i in ids)  # type: ignore[union-attr]
    cluster.kill(first)
    killed_at = time.monotonic()
    cluster.worker(concurrency=16)
    cluster.beat()

    ended = wait_until(
        lambda: (r := svc.store.runs.get(waiting)) is not None and r.terminal and r,
        120,
        "the waiting run to end",
        0.2,
        lambda: [c.status if c else None for c in svc.store.runs.get_many([waiting, *ids])],
    )
    print(f"\nthe wait answered {time.monotonic() - killed_at:.1f}s after the kill")
    assert ended.status == "ok", ended.error
    answer = json.loads(str(ended.reply))
    assert answer["completed"], answer
    assert len(answer["completed"]) + len(answer["pending"]) == CHILDREN

    collected: list[dict[str, Any]] = list(answer["completed"])
    pending = answer["pending"]
    deadline = time.monotonic() + 120
    while pending:
        assert time.monotonic() < deadline, f"still pending: {pending}"
        out = agents_wait.handle(ctx, {"ids": pending, "timeoutSeconds": 0})  # no wait
        collected += out["completed"]
        pending = out["pending"]
        time.sleep(0.2)
    by_run = {run_id: i for i, run_id in enumerate(ids)}
    assert sorted(c["runId"] for c in collected) == sorted(ids)
    for item in collected:
        assert item["status"] == "done"
        assert item["result"] == f"answer {by_run[item['runId']]}"
    # Each child completed once: one log entry each, in the order they were collected.
    assert svc.store.collect.log(PARENT) == [c["runId"] for c in collected]
    assert any(r.attempt > 1 for r in svc.store.runs.get_many(ids) if r is not None)
