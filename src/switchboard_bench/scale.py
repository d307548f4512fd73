"""Reads at scale: `sessions_list` over a million sessions, `sessions_history` of a long
transcript, each against what a file-based store does (read everything, filter, sort).

The tool calls run in the bench process against the stack's real Redis (the handler the
api and the worker call), and over HTTP through `/tools/invoke` for comparison. Loading
is setup, timed and reported but not measured against anything. The listing can run on
stacks cut into several numbers of slot groups side by side (``switchboard bench
--slot-groups 1 --slot-groups 64``): what reading every group's indexes costs it.
"""

from __future__ import annotations

import contextlib
import heapq
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
from rich.progress import Progress

from switchboard.shared.errors import Unavailable
from switchboard.shared.services import Services
from switchboard.shared.tools.registry import ToolContext
from switchboard_bench import loader
from switchboard_bench.harness import ONE_AGENT_STACK, BenchRun, Stack, phase, stack
from switchboard_bench.report import Outcome, latency_summary, ratio
from switchboard_testkit.bulk import BulkLoader

REQUESTER = "agent:main:main"
_LIST_ARGS: dict[str, Any] = {"limit": 50, "kinds": ["group", "cron"], "activeMinutes": 24 * 60}
_SPAN_MS = 7 * 24 * 3600 * 1000  # loaded sessions were last active within a week
_LIST_TARGET_MS = 5.0
_LIST_TARGET_SPEEDUP = 100.0
_HISTORY_TARGET_MS = 5.0


def listing(run: BenchRun, slot_groups: Sequence[int] = ()) -> Outcome:
    """`sessions_list` (limit 50, kinds, activeMinutes) with many sessions stored.

    ``slot_groups``: the stacks' ``SWITCHBOARD_SLOT_GROUPS`` (default: the setting's, 1 on
    one Redis); with several, each value gets a stack of its own beside the first, loaded
    alike, their samples interleaved; the anchor and the target are the first's."""
    count = 20_000 if run.quick else 1_000_000
    samples, scans = (100, 3) if run.quick else (200, 1)
    groups: list[int | None] = list(slot_groups) or [None]
    with contextlib.ExitStack() as beside:
        sides = [_listing_stack(run, groups[0])]
        sides += [beside.enter_context(_stack_beside(run, g)) for g in groups[1:]]
        loads = [_load_listing(run.progress, count, st, svc) for st, svc in sides]
        measured = _measure_tools(sides, run.progress, "sessions_list", _LIST_ARGS, samples)
        svc = sides[0][1]
        scanned: list[str] = []
        base = _sample(
            run.progress,
            "listing: anchor full scan",
            scans,
            lambda: scanned.__setitem__(slice(None), _full_scan(svc)),
        )
        variants = [
            _Variant(st.settings().groups, side_svc.store.sessions.count(), load_s, *tool)
            for (st, side_svc), load_s, tool in zip(sides, loads, measured, strict=True)
        ]
    return _listing_outcome(variants, base, scanned, count=count, samples=samples)


@dataclass(frozen=True)
class _Variant:
    """One listing stack's figures: its slot groups, its load, its tool samples."""

    slot_groups: int
    stored: int
    load_s: float
    result: dict[str, Any]
    ours_ms: list[float]
    http_ms: list[float]

    @property
    def listed(self) -> list[str]:
        """The session keys the tool listed."""
        return [row["key"] for row in self.result["sessions"]]

    def figure(self) -> dict[str, Any]:
        """Its p50s and the rest, in-process and over HTTP."""
        return {**latency_summary(self.ours_ms), "http": latency_summary(self.http_ms)}


def _listing_outcome(
    variants: Sequence[_Variant],
    base: list[float],
    scanned: list[str],
    *,
    count: int,
    samples: int,
) -> Outcome:
    first = variants[0]
    figure = first.figure()
    anchor = latency_summary(base)
    speedup = ratio(anchor["p50_ms"], figure["p50_ms"])
    figure_text = (
        f"p50 {figure['p50_ms']:.2f} ms, p99 {figure['p99_ms']:.2f} ms "
        f"(HTTP p50 {figure['http']['p50_ms']:.1f} ms)"
    )
    compared: dict[str, Any] = {}
    if len(variants) > 1:
        figure["bySlotGroups"] = by_slot_groups(variants)
        figure_text += " with " + slot_groups_text(figure["bySlotGroups"])
        compared["bySlotGroups"] = (
            "one stack per slot-groups value, each on its own Redis with the same sessions "
            "loaded, their samples interleaved; the anchor and the target are the first's"
        )
    return Outcome(
        scenario="listing",
        title="listing at scale",
        figure=figure,
        anchor={"what": "read every session hash, filter, sort (a file-based store)", **anchor},
        ratio=speedup,
        ratio_text="anchor p50 / p50 (speed-up)",
        target=f"p50 ≤ {_LIST_TARGET_MS:g} ms and ≥ {_LIST_TARGET_SPEEDUP:g}x faster",
        passed=figure["p50_ms"] <= _LIST_TARGET_MS and speedup >= _LIST_TARGET_SPEEDUP,
        figure_text=figure_text,
        anchor_text=f"p50 {anchor['p50_ms']:,.0f} ms",
        parameters={
            "sessionsStored": first.stored,
            "loadS": round(first.load_s, 1),
            "slotGroups": first.slot_groups,
            "args": _LIST_ARGS,
            "visibility": "agent",
            "kindsCycled": ["group", "cron", "hook", "other", "node"],
            "updatedAtSpread": "uniform over the last 7 days",
            "samples": samples,
            "anchorSamples": len(base),
            "measured": "tool handler in-process against the real Redis; http = /tools/invoke",
            **compared,
        },
        checks={
            "stored": all(v.stored >= count for v in variants),
            "fiftyRows": all(len(v.listed) == 50 for v in variants),
            "sameAsFullScan": set(first.listed) == set(scanned),
            "sameForEverySlotGroups": all(set(v.listed) == set(first.listed) for v in variants),
        },
    )


def by_slot_groups(variants: Sequence[_Variant]) -> list[dict[str, Any]]:
    """Each stack's p50s (in-process and over HTTP), with their ratio to the first's."""
    first = variants[0].figure()
    out = []
    for v in variants:
        figure = v.figure()
        out.append(
            {
                "slotGroups": v.slot_groups,
                **figure,
                "p50ToFirst": ratio(figure["p50_ms"], first["p50_ms"]),
                "httpP50ToFirst": ratio(figure["http"]["p50_ms"], first["http"]["p50_ms"]),
                "sessionsStored": v.stored,
                "loadS": round(v.load_s, 1),
            }
        )
    return out


def slot_groups_text(rows: Sequence[dict[str, Any]]) -> str:
    """The first stack's slot groups, then each other's p50s and their ratios to the
    first's: ``1 slot group; 64 slot groups: p50 2.10 ms, 1.40x (HTTP 3.4 ms, 1.17x)``."""
    first, *others = rows
    return "; ".join(
        [_groups(first["slotGroups"])]
        + [
            f"{_groups(row['slotGroups'])}: p50 {row['p50_ms']:.2f} ms, "
            f"{row['p50ToFirst']:.2f}x (HTTP {row['http']['p50_ms']:.1f} ms, "
            f"{row['httpP50ToFirst']:.2f}x)"
            for row in others
        ]
    )


def _groups(n: int) -> str:
    return f"{n} slot group{'' if n == 1 else 's'}"


def _listing_stack(run: BenchRun, groups: int | None) -> tuple[Stack, Services]:
    """The run's shared stack for the listing (cut into ``groups`` slot groups if given)."""
    if groups is None:
        st = run.stacks.get("listing", **ONE_AGENT_STACK)
    else:
        st = run.stacks.get(f"listing, {groups} slot groups", **ONE_AGENT_STACK, slot_groups=groups)
    return st, st.services()


@contextlib.contextmanager
def _stack_beside(run: BenchRun, groups: int | None) -> Iterator[tuple[Stack, Services]]:
    """Another listing stack, cut into ``groups`` slot groups, beside the shared one while
    the scenario runs (no anchor workers: the listing's anchor is a scan)."""
    options = {**ONE_AGENT_STACK, "anchors": False, "slot_groups": groups}
    with contextlib.ExitStack() as running:
        with phase(run.progress, f"listing, {groups} slot groups: start processes"):
            st = running.enter_context(stack(**options))
        yield st, st.services()


def _load_listing(progress: Progress, count: int, st: Stack, svc: Services) -> float:
    """Write the template session with one real run, then ``count`` sessions like it;
    the seconds the load took."""
    groups = st.settings().groups
    with phase(progress, "listing: one real run for the session template"):
        template = loader.real_template(st, svc.store, "agent:main:discord:group:template")
    load_s = _timed_load(
        progress,
        f"listing: load {count:,} sessions ({_groups(groups)})",
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
    progress.console.print(
        f"listing: loaded {count:,} sessions in {load_s:.1f} s ({_groups(groups)})"
    )
    return load_s


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
    return _measure_tools([(st, svc)], progress, tool, args, n)[0]


def _measure_tools(
    sides: Sequence[tuple[Stack, Services]],
    progress: Progress,
    tool: str,
    args: dict[str, Any],
    n: int,
) -> list[tuple[dict[str, Any], list[float], list[float]]]:
    """On each stack: the tool's result, and latencies in-process and over HTTP, every
    sample of every stack interleaved (one in-process and one HTTP call each in turn)."""
    body = {"tool": tool, "args": args, "sessionKey": REQUESTER}
    with contextlib.ExitStack() as clients:
        calls = []
        for st, svc in sides:
            spec = svc.tools.get(tool)
            assert spec is not None, tool
            http = clients.enter_context(st.http())
            calls.append((partial(spec.handler, _context(svc)), partial(_over_http, http, body)))
        results = []
        for in_process, over_http in calls:
            results.append(in_process(dict(args)))
            over_http()
        task = progress.add_task(f"{tool}: in-process / over HTTP (interleaved)", total=n)
        ours: list[list[float]] = [[] for _ in sides]
        http_ms: list[list[float]] = [[] for _ in sides]
        for _ in range(n):
            for i, (in_process, over_http) in enumerate(calls):
                t0 = time.perf_counter()
                in_process(dict(args))
                t1 = time.perf_counter()
                over_http()
                t2 = time.perf_counter()
                ours[i].append((t1 - t0) * 1000)
                http_ms[i].append((t2 - t1) * 1000)
            progress.advance(task)
        progress.remove_task(task)
    return list(zip(results, ours, http_ms, strict=True))


def _over_http(http: httpx.Client, body: dict[str, Any]) -> None:
    resp = http.post("/tools/invoke", json=body)
    if resp.status_code != 200:
        raise Unavailable(f"{body['tool']} over HTTP answered {resp.status_code}: {resp.text}")


def _full_scan(svc: Services) -> list[str]:
    """What a file-based store does: read every entry, filter, sort; the top keys.

    Lean on purpose (raw replies, cheapest filter first, a heap for the top ``limit``), so
    the anchor is the fastest honest full scan, not a strawman."""
    store = svc.store
    kinds = set(_LIST_ARGS["kinds"])
    min_updated = int(time.time() * 1000) - _LIST_ARGS["activeMinutes"] * 60_000
    limit = int(_LIST_ARGS["limit"])
    top: list[tuple[int, str]] = []
    for key, raw in BulkLoader(store.redis, store.ks).scan_sessions():
        updated = int(raw.get(b"updatedAt") or 0)
        if updated < min_updated or store.sessions.kind_of(key.decode()) not in kinds:
            continue
        if len(top) < limit:
            heapq.heappush(top, (updated, key.decode()))
        else:
            heapq.heappushpop(top, (updated, key.decode()))
    return [key for _, key in sorted(top, reverse=True)]
