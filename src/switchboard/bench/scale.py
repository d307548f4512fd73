"""Reads at scale: `sessions_list` over a million sessions, `sessions_history` of a long
transcript, each against what a file-based store does (read everything, filter, sort).

The tool calls run in the bench process against the stack's real Redis (the handler the
api and the worker call), and over HTTP through `/tools/invoke` for comparison. Loading
is setup, timed and reported but not measured against anything.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

from rich.progress import Progress

from switchboard.bench import loader
from switchboard.bench.harness import ONE_AGENT_STACK, BenchRun, Stack, phase
from switchboard.bench.report import Outcome, latency_summary, ratio
from switchboard.shared.errors import Unavailable
from switchboard.shared.services import Services
from switchboard.shared.tools.registry import ToolContext

REQUESTER = "agent:main:main"
_LIST_ARGS: dict[str, Any] = {"limit": 50, "kinds": ["group", "cron"], "activeMinutes": 24 * 60}
_SPAN_MS = 7 * 24 * 3600 * 1000  # loaded sessions were last active within a week
_LIST_TARGET_MS = 5.0
_LIST_TARGET_SPEEDUP = 100.0
_HISTORY_TARGET_MS = 5.0


def listing(run: BenchRun) -> Outcome:
    """`sessions_list` (limit 50, kinds, activeMinutes) with many sessions stored."""
    count = 20_000 if run.quick else 1_000_000
    samples, scans = (100, 3) if run.quick else (200, 1)
    progress = run.progress
    st = run.stacks.get("listing", **ONE_AGENT_STACK)
    svc = st.services()
    with phase(progress, "listing: one real run for the session template"):
        template = loader.real_template(st, svc.store, "agent:main:discord:group:template")
    load_s = _timed_load(
        progress,
        f"listing: load {count:,} sessions",
        count,
        lambda advance: loader.load_sessions(
            svc.store,
            template.session,
            count,
            now_ms=int(time.time() * 1000),
            span_ms=_SPAN_MS,
            progress=advance,
        ),
    )
    progress.console.print(f"listing: loaded {count:,} sessions in {load_s:.1f} s")
    result, ours, http_ms = _measure_tool(st, svc, progress, "sessions_list", _LIST_ARGS, samples)
    scanned: list[str] = []
    base = _sample(
        progress,
        "listing: anchor full scan",
        scans,
        lambda: scanned.__setitem__(slice(None), _full_scan(svc)),
    )
    stored = svc.store.sessions.count()
    figure: dict[str, Any] = {**latency_summary(ours), "http": latency_summary(http_ms)}
    anchor = latency_summary(base)
    speedup = ratio(anchor["p50_ms"], figure["p50_ms"])
    listed = [row["key"] for row in result["sessions"]]
    return Outcome(
        scenario="listing",
        title="listing at scale",
        figure=figure,
        anchor={"what": "read every session hash, filter, sort (a file-based store)", **anchor},
        ratio=speedup,
        ratio_text="anchor p50 / p50 (speed-up)",
        target=f"p50 ≤ {_LIST_TARGET_MS:g} ms and ≥ {_LIST_TARGET_SPEEDUP:g}x faster",
        passed=figure["p50_ms"] <= _LIST_TARGET_MS and speedup >= _LIST_TARGET_SPEEDUP,
        figure_text=(
            f"p50 {figure['p50_ms']:.2f} ms, p99 {figure['p99_ms']:.2f} ms "
            f"(HTTP p50 {figure['http']['p50_ms']:.1f} ms)"
        ),
        anchor_text=f"p50 {anchor['p50_ms']:,.0f} ms",
        parameters={
            "sessionsStored": stored,
            "loadS": round(load_s, 1),
            "args": _LIST_ARGS,
            "visibility": "agent",
            "kindsCycled": ["group", "cron", "hook", "other", "node"],
            "updatedAtSpread": "uniform over the last 7 days",
            "samples": samples,
            "anchorSamples": scans,
            "measured": "tool handler in-process against the real Redis; http = /tools/invoke",
        },
        checks={
            "stored": stored >= count,
            "fiftyRows": len(listed) == 50,
            "sameAsFullScan": set(listed) == set(scanned),
        },
    )


def history(run: BenchRun) -> Outcome:
    """`sessions_history` (limit 50) of one very long transcript."""
    count = 10_000 if run.quick else 100_000
    samples, reads = (100, 5) if run.quick else (300, 5)
    key = "agent:main:bench:history"
    progress = run.progress
    st = run.stacks.get("history", **ONE_AGENT_STACK)
    svc = st.services()
    with phase(progress, "history: real runs for the message template"):
        template = loader.real_template(st, svc.store, key)
    load_s = _timed_load(
        progress,
        f"history: load {count:,} messages",
        count - len(template.messages),
        lambda advance: loader.load_transcript(
            svc.store, key, template.messages, count, progress=advance
        ),
    )
    progress.console.print(f"history: loaded {count:,} messages in {load_s:.1f} s")
    args = {"sessionKey": key, "limit": 50}
    result, ours, http_ms = _measure_tool(st, svc, progress, "sessions_history", args, samples)
    base = _sample(
        progress, "history: anchor full read", reads, lambda: svc.store.transcripts.all(key)
    )
    length = svc.store.transcripts.length(key)
    figure: dict[str, Any] = {**latency_summary(ours), "http": latency_summary(http_ms)}
    anchor = latency_summary(base)
    return Outcome(
        scenario="history",
        title="history at scale",
        figure=figure,
        anchor={"what": "read the whole transcript and decode it", **anchor},
        ratio=ratio(anchor["p50_ms"], figure["p50_ms"]),
        ratio_text="anchor p50 / p50 (speed-up)",
        target=f"p50 ≤ {_HISTORY_TARGET_MS:g} ms",
        passed=figure["p50_ms"] <= _HISTORY_TARGET_MS,
        figure_text=(
            f"p50 {figure['p50_ms']:.2f} ms, p99 {figure['p99_ms']:.2f} ms "
            f"(HTTP p50 {figure['http']['p50_ms']:.1f} ms)"
        ),
        anchor_text=f"p50 {anchor['p50_ms']:,.0f} ms",
        parameters={
            "transcriptMessages": length,
            "loadS": round(load_s, 1),
            "args": args,
            "samples": samples,
            "anchorSamples": reads,
            "measured": "tool handler in-process against the real Redis; http = /tools/invoke",
        },
        checks={"stored": length >= count, "fiftyMessages": len(result["messages"]) == 50},
    )


def _context(svc: Services) -> ToolContext:
    """The tool context the api builds for a request acting as the main session."""
    return ToolContext(
        services=svc, session_key=REQUESTER, agent_id="main", channel="webchat", owner=True
    )


def _timed_load(
    progress: Progress, label: str, total: int, load: Callable[[Callable[[int], None]], None]
) -> float:
    task = progress.add_task(label, total=total)
    t0 = time.perf_counter()
    load(lambda n: progress.advance(task, n))
    progress.remove_task(task)
    return time.perf_counter() - t0


def _sample(progress: Progress, label: str, n: int, fn: Callable[[], object]) -> list[float]:
    task = progress.add_task(label, total=n)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
        progress.advance(task)
    progress.remove_task(task)
    return out


def _measure_tool(
    st: Stack, svc: Services, progress: Progress, tool: str, args: dict[str, Any], n: int
) -> tuple[dict[str, Any], list[float], list[float]]:
    """The tool's result, and latencies in-process and over HTTP, sampled interleaved."""
    spec = svc.tools.get(tool)
    assert spec is not None, tool
    ctx = _context(svc)
    body = {"tool": tool, "args": args, "sessionKey": REQUESTER}
    with st.http() as http:

        def over_http() -> None:
            resp = http.post("/tools/invoke", json=body)
            if resp.status_code != 200:
                raise Unavailable(f"{tool} over HTTP answered {resp.status_code}: {resp.text}")

        result = spec.handler(ctx, dict(args))
        over_http()
        task = progress.add_task(f"{tool}: in-process / over HTTP (interleaved)", total=n)
        ours: list[float] = []
        http_ms: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            spec.handler(ctx, dict(args))
            t1 = time.perf_counter()
            over_http()
            t2 = time.perf_counter()
            ours.append((t1 - t0) * 1000)
            http_ms.append((t2 - t1) * 1000)
            progress.advance(task)
        progress.remove_task(task)
    return result, ours, http_ms


def _full_scan(svc: Services) -> list[str]:
    """What a file-based store does: read every entry, filter, sort; the top keys.

    Lean on purpose (raw replies, cheapest filter first, a heap for the top ``limit``), so
    the anchor is the fastest honest full scan, not a strawman."""
    store = svc.store
    kinds = set(_LIST_ARGS["kinds"])
    min_updated = int(time.time() * 1000) - _LIST_ARGS["activeMinutes"] * 60_000
    limit = int(_LIST_ARGS["limit"])
    top: list[tuple[int, str]] = []
    for key, raw in store.bulk.scan_sessions():
        updated = int(raw.get(b"updatedAt") or 0)
        if updated < min_updated or store.sessions.kind_of(key.decode()) not in kinds:
            continue
        if len(top) < limit:
            heapq.heappush(top, (updated, key.decode()))
        else:
            heapq.heappushpop(top, (updated, key.decode()))
    return [key for _, key in sorted(top, reverse=True)]
