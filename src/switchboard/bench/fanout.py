"""Fan-out: one batch `sessions_spawn` of many sub-agents whose model takes one second.

The sub-agents' model is the project's fake OpenAI-compatible server with 1 s latency
(configured through `models.providers`), one worker process holds every child run in
flight, and the figure is the time from the spawn call until every announce is in the
requester's transcript. The anchors are computed: one child after another, and OpenClaw's
sub-agent lane of 8 concurrent runs.

Beside it, the same fan-out as collector children (`collect: true`) drained with
`agents_wait`: the requester calls it with the pending ids until none is left, and the
figure is the time from the spawn call until the last completion was collected.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rich.progress import Progress

from switchboard.bench.harness import BenchRun, Stack, fake_model, phase
from switchboard.bench.report import Outcome, ratio
from switchboard.shared.store.transcripts import TranscriptStore

REQUESTER = "agent:main:main"
MODEL_LATENCY_S = 1.0
OPENCLAW_LANE = 8
TARGET_S = 10.0


def fanout(run: BenchRun) -> Outcome:
    """Time until all announces of one batch spawn have landed in the requester's transcript."""
    n = 100 if run.quick else 1000
    concurrency = n + 64  # every child in flight, plus room for announce steps
    with contextlib.ExitStack() as exits:
        with phase(run.progress, "fanout: start the fake model server"):
            base_url = exits.enter_context(fake_model(MODEL_LATENCY_S * 1000))
        exits.callback(run.stacks.close)  # its config names this model server
        st = run.stacks.get("fanout", config=_config(base_url, n), worker_concurrency=concurrency)
        with phase(run.progress, "fanout: warm up"):
            st.warm_up()
        outcome = _measure(st, run.progress, n, concurrency)
        st.wait_idle()
        _add_drain(outcome, _drain(st, run.progress, n))
        return outcome


def _config(base_url: str, n: int) -> dict[str, Any]:
    provider = {"baseUrl": base_url, "apiKey": "bench", "api": "openai-completions"}
    return {
        "models": {"providers": {"fake": provider}},
        "agents": {
            "defaults": {"subagents": {"model": "fake/fake-model", "maxChildrenPerAgent": n}}
        },
        # The drain's collector children are one (ungrouped) group of n.
        "tools": {"swarm": {"enabled": True, "maxChildrenPerGroup": n, "maxTotalPerGroup": n}},
    }


def _measure(st: Stack, progress: Progress, n: int, concurrency: int) -> Outcome:
    transcripts = st.store().transcripts
    baseline = transcripts.length(REQUESTER)
    tasks = [{"task": f"child {i}: say done", "label": f"bench-child-{i}"} for i in range(n)]
    task = progress.add_task(f"fanout: {n} sub-agents, announces back", total=n)
    t0 = time.monotonic()
    with st.http() as http:
        result = st.tool(http, "sessions_spawn", REQUESTER, tasks=tasks, join="each")
    spawn_s = time.monotonic() - t0
    accepted = result.get("status") == "accepted"
    first_s: float | None = None
    count = 0
    deadline = t0 + (60 if n <= 100 else 300)
    while accepted and count < n and time.monotonic() < deadline:
        count = transcripts.length(REQUESTER) - baseline
        if count and first_s is None:
            first_s = time.monotonic() - t0
        progress.update(task, completed=count)
        if count < n:
            st.check_alive()
            time.sleep(0.05)
    total_s = time.monotonic() - t0
    statuses = _announce_statuses(transcripts, baseline)
    progress.remove_task(task)
    sequential_s = n * MODEL_LATENCY_S
    lane_s = n / OPENCLAW_LANE * MODEL_LATENCY_S
    figure = {
        "subagents": n,
        "announced": count,
        "announceStatuses": statuses,
        "allAnnouncedS": round(total_s, 2),
        "spawnCallS": round(spawn_s, 2),
        "firstAnnounceS": None if first_s is None else round(first_s, 2),
    }
    return Outcome(
        scenario="fanout",
        title="fan-out",
        figure=figure,
        anchor={
            "what": "computed: children one after another, and OpenClaw's lane of 8",
            "sequentialS": sequential_s,
            "openclawLane8S": lane_s,
        },
        ratio=ratio(lane_s, total_s),
        ratio_text="speed-up over the lane of 8",
        target=f"≤ {TARGET_S:g} s",
        passed=total_s <= TARGET_S,
        figure_text=f"{count}/{n} announced in {total_s:.1f} s (spawn call {spawn_s:.1f} s)",
        anchor_text=f"{sequential_s:.0f} s sequential, {lane_s:.1f} s lane of 8",
        parameters={
            "subagents": n,
            "modelLatencyS": MODEL_LATENCY_S,
            "model": "fake OpenAI-compatible server via models.providers (subagents.model)",
            "workers": 1,
            "workerConcurrency": concurrency,
            "spawn": "one sessions_spawn call over /tools/invoke, tasks=[...], join=each",
            "counted": "announce messages appended to the requester's transcript",
        },
        checks={
            "accepted": accepted,
            "allAnnounced": count == n,
            "allOk": statuses.get("ok", 0) == n,
        },
        notes=[] if accepted else [f"spawn refused: {result}"],
    )


def _announce_statuses(transcripts: TranscriptStore, baseline: int) -> dict[str, int]:
    """Children by the `Status:` line of their announce in the requester's transcript."""
    counts: dict[str, int] = {}
    for message in transcripts.after(REQUESTER, baseline):
        status = "unknown"
        for line in str(message.get("content", "")).splitlines():
            if line.startswith("Status: "):
                status = line.removeprefix("Status: ").strip()
                break
        counts[status] = counts.get(status, 0) + 1
    return counts


# The drain's agents_wait calls: each waits at most this long for a first completion.
DRAIN_WAIT_S = 30


def _drain(st: Stack, progress: Progress, n: int) -> dict[str, Any]:
    """Spawn n collector children in one call, then call agents_wait with the pending ids
    until every completion is collected: the time to the last one, and the calls made."""
    tasks = [
        {"task": f"collector {i}: say done", "label": f"bench-collector-{i}"} for i in range(n)
    ]
    task = progress.add_task(f"fanout: {n} collectors, agents_wait drain", total=n)
    statuses: dict[str, int] = {}
    calls, first_s = 0, None
    t0 = time.monotonic()
    deadline = t0 + (60 if n <= 100 else 300)
    with st.http() as http:
        result = st.tool(http, "sessions_spawn", REQUESTER, tasks=tasks, collect=True)
        spawn_s = time.monotonic() - t0
        pending = [r["runId"] for r in result.get("runs", []) if r.get("runId")]
        accepted = result.get("status") == "accepted" and len(pending) == n
        while accepted and pending and time.monotonic() < deadline:
            out = st.tool(http, "agents_wait", REQUESTER, ids=pending, timeoutSeconds=DRAIN_WAIT_S)
            calls += 1
            for item in out.get("completed", []):
                statuses[item["status"]] = statuses.get(item["status"], 0) + 1
            if statuses and first_s is None:
                first_s = time.monotonic() - t0
            pending = out.get("pending", [])
            progress.update(task, completed=n - len(pending))
            if out.get("errors"):
                break
            st.check_alive()
    total_s = time.monotonic() - t0
    progress.remove_task(task)
    return {
        "collectors": n,
        "collected": sum(statuses.values()),
        "statuses": statuses,
        "lastCompletionS": round(total_s, 2),
        "firstCompletionS": None if first_s is None else round(first_s, 2),
        "spawnCallS": round(spawn_s, 2),
        "agentsWaitCalls": calls,
        "accepted": accepted,
        "note": None if accepted else f"spawn refused: {result}",
    }


def _add_drain(outcome: Outcome, drain: dict[str, Any]) -> None:
    """Report the agents_wait drain beside the announce figure (its own checks too)."""
    n = drain["collectors"]
    outcome.figure["agentsWaitDrain"] = {k: v for k, v in drain.items() if k != "note"}
    outcome.figure_text += (
        f"; agents_wait drain: {drain['collected']}/{n} collected in "
        f"{drain['lastCompletionS']:.1f} s ({drain['agentsWaitCalls']} calls)"
    )
    outcome.parameters["drain"] = (
        "one sessions_spawn call, tasks=[...], collect=true; then agents_wait over "
        f"/tools/invoke with the pending ids (timeoutSeconds {DRAIN_WAIT_S}) until none is "
        "pending; figure: spawn call to the last completion collected"
    )
    outcome.checks["drainAccepted"] = bool(drain["accepted"])
    outcome.checks["allCollected"] = drain["collected"] == n
    outcome.checks["allCollectedDone"] = drain["statuses"].get("done", 0) == n
    if drain["note"]:
        outcome.notes.append(drain["note"])
