"""Tools: one batch `sessions_spawn` of sub-agents that each call an MCP tool of a capped
server (`mcp.servers.<name>.maxConcurrent`).

The MCP server is the testkit's gauge (`switchboard_testkit.gauge_mcp`, the official `mcp`
SDK over Streamable HTTP): its `hold` tool answers after 200 ms and the server logs, per
call, its own time and the calls in flight when it began. Each sub-agent runs on the echo
model, whose task has the line ``/tool gauge__hold {"ms": 200, "id": …}``; one worker holds
every child run. The figures:

- the time from the spawn call until every announce is in the requester's transcript (the
  floor is the calls one slot-width at a time: n x 200 ms / maxConcurrent);
- the most calls in flight at the server (never above ``maxConcurrent``);
- a tool call's overhead: its round trip as the run measured it (the transcript's
  ``durationMs`` minus ``slotWaitMs``, the wait for a slot) minus the server's own time for
  the same call (matched by its ``id``), p50 and p90, under the fan-out (the figure judged)
  and for calls made one after another on the idle stack afterwards (the path's own cost;
  the difference is the wait behind the worker's other runs for a turn of its loop). The
  anchor is the same calls one after another by a bare pydantic-ai `MCPToolset` (the MCP
  client and server stack's own cost, no run, limiter or transcript).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from fastmcp.client.transports import StreamableHttpTransport
from pydantic_ai.mcp import MCPToolset
from rich.progress import Progress

from switchboard.shared.store.transcripts import TranscriptStore
from switchboard_bench.costs import cpu_s
from switchboard_bench.harness import WORKER_CONCURRENCY, BenchRun, Stack, phase
from switchboard_bench.report import Outcome, latency_summary, percentile, ratio
from switchboard_testkit.gauge_mcp import read_log, start
from switchboard_testkit.up import free_port

REQUESTER = "agent:main:main"
SERVER = "gauge"
SUBAGENTS = 1000
QUICK_SUBAGENTS = 100
HOLD_MS = 200.0
MAX_CONCURRENT = 50
# All announced within (s), and a call's overhead p50 (ms).
TARGET_S = 8.0
OVERHEAD_TARGET_MS = 3.0
# Calls one after another on the idle stack, after the fan-out (the path's own overhead).
IDLE_CALLS = 10


def tools(run: BenchRun) -> Outcome:
    """Sub-agents calling a capped MCP server's tool: time until all announced, the peak
    in flight at the server, and a tool call's overhead."""
    n = QUICK_SUBAGENTS if run.quick else SUBAGENTS
    with contextlib.ExitStack() as exits:
        port = free_port()
        scratch = exits.enter_context(tempfile.TemporaryDirectory(prefix="switchboard-bench-"))
        log = Path(scratch) / "gauge.jsonl"
        with phase(run.progress, "tools: start the MCP server"):
            server = start(port, log)
        exits.callback(_stop, server)
        exits.callback(run.stacks.close)  # its config names this server
        st = run.stacks.get("tools", config=_config(port, n), worker_concurrency=WORKER_CONCURRENCY)
        with phase(run.progress, "tools: warm up"):
            st.warm_up()
            _warm_server(st)
        log.write_text("")  # the measurement's calls only
        figure = _measure(st, run.progress, n, log, psutil.Process(server.pid))
        st.wait_idle(timeout_s=120)
        with phase(run.progress, f"tools: {IDLE_CALLS} calls one after another, idle"):
            figure["idleOverheadMs"] = _idle_overhead(st, log)
        with phase(run.progress, f"tools: {IDLE_CALLS} calls by a bare MCP client"):
            bare = _bare_overhead(port, log)
        return _outcome(figure, bare)


def _config(port: int, n: int) -> dict[str, Any]:
    server = {
        "url": f"http://127.0.0.1:{port}/mcp",
        "transport": "streamable-http",
        "maxConcurrent": MAX_CONCURRENT,
    }
    return {
        "mcp": {"servers": {SERVER: server}},
        "agents": {"defaults": {"subagents": {"maxChildrenPerAgent": n}}},
    }


def _line(call_id: str) -> str:
    return f"/tool {SERVER}__hold " + json.dumps({"ms": HOLD_MS, "id": call_id})


def _warm_server(st: Stack) -> None:
    """One call of the tool by a run (the worker connects to the server)."""
    with st.http() as http:
        started = st.rpc(http, "agent", sessionKey="agent:main:bench-tools", message=_line("w"))
        st.rpc(http, "agent.wait", runId=started["runId"], timeoutMs=60_000)


def _measure(
    st: Stack, progress: Progress, n: int, log: Path, server: psutil.Process
) -> dict[str, Any]:
    transcripts = st.store().transcripts
    baseline = transcripts.length(REQUESTER)
    # The directive on a line of its own (the child's message opens with its context).
    tasks = [
        {"task": f"call the tool\n{_line(f'c{i}')}", "label": f"bench-tools-{i}"} for i in range(n)
    ]
    task = progress.add_task(f"tools: {n} sub-agents, each an MCP call", total=n)
    procs = {"worker": psutil.Process(st.pid("worker0")), "api": psutil.Process(st.pid("api"))}
    procs["mcpServer"] = server
    cpu_before = {name: cpu_s([p]) for name, p in procs.items()}
    t0 = time.monotonic()
    with st.http() as http:
        result = st.tool(http, "sessions_spawn", REQUESTER, tasks=tasks, join="each")
    spawn_s = time.monotonic() - t0
    accepted = result.get("status") == "accepted"
    count = 0
    deadline = t0 + 300
    while accepted and count < n and time.monotonic() < deadline:
        count = transcripts.length(REQUESTER) - baseline
        progress.update(task, completed=count)
        if count < n:
            st.check_alive()
            time.sleep(0.02)
    total_s = time.monotonic() - t0
    cpu = {name: cpu_s([p]) - cpu_before[name] for name, p in procs.items()}
    progress.remove_task(task)
    children = [str(r["childSessionKey"]) for r in result.get("runs", [])]
    records = _call_records(transcripts, children)
    calls = read_log(log)
    own = {c["id"]: c["ownMs"] for c in calls}
    overheads = _overheads(records, own)
    waits = [r.get("slotWaitMs", 0.0) for r in records]
    return {
        "subagents": n,
        "announced": count,
        "accepted": accepted,
        "allAnnouncedS": round(total_s, 2),
        "spawnCallS": round(spawn_s, 2),
        "floorS": n * HOLD_MS / 1000 / MAX_CONCURRENT,
        "callsAtServer": len(calls),
        "maxInFlightAtServer": max((c["inFlight"] for c in calls), default=0),
        "callOutcomes": _outcomes(records),
        # On the host's monotonic clock, from the spawn call: the first call's start at
        # the server, and the last call's end.
        "firstCallAtS": round(min(c["start"] for c in calls) - t0, 2) if calls else None,
        "lastCallEndS": round(max(c["end"] for c in calls) - t0, 2) if calls else None,
        "overheadMs": latency_summary(overheads) if overheads else None,
        "overheadSamples": len(overheads),
        "slotWaitMsP50": round(percentile(waits, 50), 1) if waits else None,
        "serverOwnMsP50": round(percentile(list(own.values()), 50), 1) if own else None,
        # Each process's CPU over the measurement, per sub-agent, and its share of a core
        # (two cores on the reference host: what the call's round trip waits behind).
        "cpuMsPerSubagent": {k: round(v * 1000 / n, 2) for k, v in cpu.items()},
        "coreShare": {k: round(v / total_s, 2) for k, v in cpu.items()} if total_s else {},
        "note": None if accepted else f"spawn refused: {result}"[:500],
    }


def _overheads(records: list[dict[str, Any]], own: dict[str, float]) -> list[float]:
    """Each ok call's round trip as the run measured it, its slot wait and the server's
    own time taken out (ms)."""
    return [
        r["durationMs"] - r.get("slotWaitMs", 0.0) - own[r["arguments"]["id"]]
        for r in records
        if r["outcome"] == "ok" and r["arguments"].get("id") in own
    ]


def _idle_overhead(st: Stack, log: Path) -> dict[str, float] | None:
    """The overhead of calls made one after another by one run on the idle stack (the
    path's own cost, with nothing else running)."""
    session = "agent:main:bench-tools-idle"
    lines = "\n".join(_line(f"idle{i}") for i in range(IDLE_CALLS))
    with st.http() as http:
        started = st.rpc(http, "agent", sessionKey=session, message=lines)
        st.rpc(http, "agent.wait", runId=started["runId"], timeoutMs=60_000)
    own = {c["id"]: c["ownMs"] for c in read_log(log)}
    overheads = _overheads(_call_records(st.store().transcripts, [session]), own)
    return latency_summary(overheads) if overheads else None


def _bare_overhead(port: int, log: Path) -> dict[str, float] | None:
    """The anchor: the same calls, one after another, by pydantic-ai's `MCPToolset` alone
    (the client a worker uses, no run, limiter or transcript): the MCP stack's own cost."""

    async def calls() -> dict[str, float]:
        toolset: MCPToolset[Any] = MCPToolset(
            StreamableHttpTransport(f"http://127.0.0.1:{port}/mcp"), id="bare"
        )
        took: dict[str, float] = {}
        async with toolset:
            await toolset.list_tools()
            for i in range(IDLE_CALLS):
                t0 = time.perf_counter()
                await toolset.direct_call_tool("hold", {"ms": HOLD_MS, "id": f"bare{i}"})
                took[f"bare{i}"] = (time.perf_counter() - t0) * 1000
        return took

    took = asyncio.run(calls())
    own = {c["id"]: c["ownMs"] for c in read_log(log)}
    overheads = [ms - own[i] for i, ms in took.items() if i in own]
    return latency_summary(overheads) if overheads else None


def _call_records(transcripts: TranscriptStore, children: list[str]) -> list[dict[str, Any]]:
    """The MCP call records (`call` of each toolResult) in the children's transcripts."""
    records = []
    for key in children:
        for message in transcripts.after(key, 0):
            call = message.get("call")
            if message.get("role") == "toolResult" and isinstance(call, dict):
                records.append(call)
    return records


def _outcomes(records: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        counts[str(r["outcome"])] = counts.get(str(r["outcome"]), 0) + 1
    return counts


def _outcome(f: dict[str, Any], bare: dict[str, float] | None) -> Outcome:
    """The scenario's outcome: judged on the time and the overhead, checked on the cap."""
    n = f["subagents"]
    overhead = f["overheadMs"] or {}
    p50 = overhead.get("p50_ms")
    idle = f.get("idleOverheadMs") or {}
    text = (
        f"{f['announced']}/{n} announced in {f['allAnnouncedS']:.1f} s (floor "
        f"{f['floorS']:.1f} s); at most {f['maxInFlightAtServer']} calls in flight at the "
        f"server (maxConcurrent {MAX_CONCURRENT}); tool call overhead p50 "
        f"{_ms(p50)}, p90 {_ms(overhead.get('p90_ms'))} (one call at a time, idle: p50 "
        f"{_ms(idle.get('p50_ms'))}); worker CPU {f['cpuMsPerSubagent']['worker']} ms per "
        f"sub-agent, {f['coreShare'].get('worker')} of a core"
    )
    passed = f["allAnnouncedS"] <= TARGET_S and p50 is not None and p50 <= OVERHEAD_TARGET_MS
    return Outcome(
        scenario="tools",
        title="MCP tool calls under maxConcurrent",
        figure={k: v for k, v in f.items() if k not in ("accepted", "note")},
        anchor={
            "what": "computed: the calls one slot-width at a time (n x 200 ms / "
            "maxConcurrent), and one after another; measured: the overhead of the same "
            "calls one after another by a bare pydantic-ai MCPToolset client",
            "floorS": f["floorS"],
            "sequentialS": n * HOLD_MS / 1000,
            "bareClientOverheadMs": bare,
        },
        ratio=ratio(f["floorS"], f["allAnnouncedS"]),
        ratio_text="the floor's share of the time taken (1 = no overhead at all)",
        target=f"{SUBAGENTS:,}: ≤ {TARGET_S:g} s; ≤ {MAX_CONCURRENT} in flight at the server; "
        f"overhead p50 ≤ {OVERHEAD_TARGET_MS:g} ms",
        passed=passed,
        figure_text=text,
        anchor_text=f"floor {f['floorS']:.1f} s, sequential {n * HOLD_MS / 1000:,.0f} s; "
        f"bare MCP client overhead p50 {_ms((bare or {}).get('p50_ms'))}",
        parameters={
            "subagents": n,
            "toolMs": HOLD_MS,
            "maxConcurrent": MAX_CONCURRENT,
            "workers": 1,
            "workerConcurrency": WORKER_CONCURRENCY,
            "model": "builtin/echo (each child's task is one /tool line)",
            "server": "switchboard_testkit.gauge_mcp over Streamable HTTP (the mcp SDK)",
            "spawn": "one sessions_spawn call over /tools/invoke, tasks=[...], join=each",
            "counted": "announce messages appended to the requester's transcript",
            "overhead": "per call: the transcript's durationMs - slotWaitMs - the server's "
            "own time for that call (matched by its id argument)",
        },
        checks={
            "accepted": bool(f["accepted"]),
            "allAnnounced": f["announced"] == n,
            "allCallsOk": f["callOutcomes"].get("ok", 0) == n,
            "capHeld": 0 < f["maxInFlightAtServer"] <= MAX_CONCURRENT,
        },
        notes=[f["note"]] if f["note"] else [],
    )


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} ms"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
