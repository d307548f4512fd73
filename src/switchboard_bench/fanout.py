"""Fan-out: one batch `sessions_spawn` of many sub-agents whose model takes one second.

The sub-agents' model is the project's fake OpenAI-compatible server with 1 s latency
(configured through `models.providers`), one worker process holds every child run in
flight, and the figure is the time from the spawn call until every announce is in the
requester's transcript. The anchors are computed: one child after another, and OpenClaw's
sub-agent lane of 8 concurrent runs.

A full run measures 1,000 and 10,000 sub-agents on the same stack, one after the other
(`switchboard bench -s fanout --subagents N`, repeatable, picks the sizes). Beside each
time: the worker's peak RSS (sampled, and its high-water mark), the peak of child runs in
flight at once (from the runs' start and end times), the memory per run in flight (the
RSS it grew by over the measurement, divided by that peak), and the worker's CPU per child
and its share of one core (the time is the worker's CPU when that share is near 1, and then
moves with the host's speed: `machine.pythonLoopNs` beside it compares hosts).

Beside it, the same fan-out as collector children (`collect: true`) drained with
`agents_wait` (for the smallest size, at most 1,000: one `agents_wait` reads that many):
the requester calls it with the pending ids until none is left, and the figure is the time
from the spawn call until the last completion was collected.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from rich.progress import Progress

from switchboard.shared.store.transcripts import TranscriptStore
from switchboard_bench.costs import cpu_s
from switchboard_bench.harness import WORKER_CONCURRENCY, BenchRun, Stack, fake_model, phase
from switchboard_bench.report import Outcome, ratio

REQUESTER = "agent:main:main"
MODEL_LATENCY_S = 1.0
OPENCLAW_LANE = 8
# The sizes a run measures, and the time each must announce within.
SIZES = (1000, 10_000)
QUICK_SIZES = (100,)
TARGETS_S = {100: 10.0, 1000: 10.0, 10_000: 30.0}
# The worker's peak RSS (its high-water mark) with the 10,000 in flight.
RSS_TARGET_MB = 500.0
RSS_TARGET_FROM = 10_000
# One agents_wait reads up to this many ids: the drain runs for the smallest size, capped.
DRAIN_MAX = 1000


def fanout(run: BenchRun, sizes: Sequence[int] | None = None) -> Outcome:
    """Time until all announces of one batch spawn have landed in the requester's
    transcript, for each size in turn; the worker's memory beside each."""
    ns = sorted(set(sizes or (QUICK_SIZES if run.quick else SIZES)))
    with contextlib.ExitStack() as exits:
        with phase(run.progress, "fanout: start the fake model server"):
            base_url = exits.enter_context(fake_model(MODEL_LATENCY_S * 1000))
        exits.callback(run.stacks.close)  # its config names this model server
        drain_n = min(ns[0], DRAIN_MAX)
        st = run.stacks.get(
            "fanout",
            config=_config(base_url, max(ns), drain_n),
            worker_concurrency=WORKER_CONCURRENCY,
        )
        with phase(run.progress, "fanout: warm up"):
            st.warm_up()
        figures = []
        for n in ns:
            figures.append(_measure(st, run.progress, n))
            st.wait_idle(timeout_s=300)
        drain = _drain(st, run.progress, drain_n)
        outcome = _outcome(figures)
        _add_drain(outcome, drain)
        return outcome


def _config(base_url: str, n: int, drain_n: int) -> dict[str, Any]:
    provider = {"baseUrl": base_url, "apiKey": "bench", "api": "openai-completions"}
    return {
        "models": {"providers": {"fake": provider}},
        "agents": {
            "defaults": {"subagents": {"model": "fake/fake-model", "maxChildrenPerAgent": n}}
        },
        # The drain's collector children are one (ungrouped) group.
        "tools": {
            "swarm": {
                "enabled": True,
                "maxChildrenPerGroup": drain_n,
                "maxTotalPerGroup": drain_n,
            }
        },
    }


class RssSamples:
    """Samples the worker's RSS every 50 ms on a thread of its own, with the time of each
    sample (so the RSS at the peak of runs in flight can be read afterwards)."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RssSamples:
        self.samples.append((time.time(), self.proc.memory_info().rss))
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(psutil.Error):
                self.samples.append((time.time(), self.proc.memory_info().rss))

    @property
    def base(self) -> int:
        return self.samples[0][1]

    @property
    def peak(self) -> int:
        return max(rss for _, rss in self.samples)

    def high_water_mark(self) -> int | None:
        """The process's peak RSS since it started (VmHWM), where the system tells it."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
        return None


def _in_flight_peak(st: Stack, run_ids: Sequence[str]) -> tuple[int, float | None]:
    """The most child runs that were running at once (claimed, not ended), from their
    records' start and end times; and when (epoch seconds)."""
    records = []
    for start in range(0, len(run_ids), 1000):
        records += st.store().runs.get_many(list(run_ids[start : start + 1000]))
    events: list[tuple[int, int]] = []
    for rec in records:
        if rec is None or not rec.started_at_ms:
            continue
        events.append((rec.started_at_ms, 1))
        if rec.ended_at_ms:
            events.append((rec.ended_at_ms, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same ms
    peak, at, current = 0, None, 0
    for ts, step in events:
        current += step
        if current > peak:
            peak, at = current, ts / 1000
    return peak, at


def _measure(st: Stack, progress: Progress, n: int) -> dict[str, Any]:
    transcripts = st.store().transcripts
    baseline = transcripts.length(REQUESTER)
    tasks = [{"task": f"child {i}: say done", "label": f"bench-{n}-child-{i}"} for i in range(n)]
    task = progress.add_task(f"fanout: {n} sub-agents, announces back", total=n)
    worker = psutil.Process(st.pid("worker0"))
    with RssSamples(worker.pid) as memory:
        cpu_before = cpu_s([worker])
        t0 = time.monotonic()
        with st.http() as http:
            result = st.tool(http, "sessions_spawn", REQUESTER, tasks=tasks, join="each")
        spawn_s = time.monotonic() - t0
        accepted = result.get("status") == "accepted"
        first_s: float | None = None
        count = 0
        deadline = t0 + (60 if n <= 100 else 300 if n <= 1000 else 900)
        while accepted and count < n and time.monotonic() < deadline:
            count = transcripts.length(REQUESTER) - baseline
            if count and first_s is None:
                first_s = time.monotonic() - t0
            progress.update(task, completed=count)
            if count < n:
                st.check_alive()
                time.sleep(0.05)
        total_s = time.monotonic() - t0
        worker_cpu_s = cpu_s([worker]) - cpu_before
    statuses = _announce_statuses(transcripts, baseline)
    failures = _failures(transcripts, baseline) if statuses.get("ok", 0) < count else []
    progress.remove_task(task)
    run_ids = [str(r["runId"]) for r in result.get("runs", []) if r.get("runId")]
    in_flight, _ = _in_flight_peak(st, run_ids)
    hwm = memory.high_water_mark()
    grew = max(0, memory.peak - memory.base)
    return {
        "subagents": n,
        "announced": count,
        "announceStatuses": statuses,
        "allAnnouncedS": round(total_s, 2),
        "spawnCallS": round(spawn_s, 2),
        "firstAnnounceS": None if first_s is None else round(first_s, 2),
        "targetS": TARGETS_S.get(n),
        "failedAnnounces": failures,
        "accepted": accepted,
        "note": None if accepted else f"spawn refused: {result}"[:500],
        "workerRssBeforeMB": round(memory.base / 2**20, 1),
        "workerPeakRssMB": round(memory.peak / 2**20, 1),
        "workerRssHighWaterMB": None if hwm is None else round(hwm / 2**20, 1),
        "peakRunsInFlight": in_flight,
        "rssPerRunInFlightKB": round(grew / in_flight / 1024, 1) if in_flight else None,
        # The worker's CPU over the measurement: per child, and the share of one core it
        # had (near 1: the worker's CPU, not the model or the store, set the time).
        "workerCpuS": round(worker_cpu_s, 2),
        "workerCpuMsPerChild": round(worker_cpu_s * 1000 / count, 2) if count else None,
        "workerCoreShare": round(worker_cpu_s / total_s, 2) if total_s > 0 else None,
    }


def _outcome(figures: list[dict[str, Any]]) -> Outcome:
    """One outcome for every size: the first one's figures at the top (as a one-size run
    reports them), each size's in ``sizes``; passed when each met its targets."""
    first = figures[0]
    verdicts = [_met(f) for f in figures]
    n_last = figures[-1]["subagents"]
    sequential_s = n_last * MODEL_LATENCY_S
    lane_s = n_last / OPENCLAW_LANE * MODEL_LATENCY_S
    figure = {
        **{k: v for k, v in first.items() if k not in ("accepted", "note")},
        "sizes": [{k: v for k, v in f.items() if k not in ("accepted", "note")} for f in figures],
    }
    texts = [
        f"{f['announced']}/{f['subagents']} announced in {f['allAnnouncedS']:.1f} s "
        f"(spawn call {f['spawnCallS']:.1f} s; worker peak RSS "
        f"{_mb(f['workerRssHighWaterMB'] or f['workerPeakRssMB'])}, "
        f"{f['rssPerRunInFlightKB']} KB per run in flight, {f['peakRunsInFlight']} at once; "
        f"worker CPU {f['workerCpuMsPerChild']} ms per child, {f['workerCoreShare']} of a core)"
        for f in figures
    ]
    targets = [f"{f['subagents']:,}: ≤ {f['targetS']:g} s" for f in figures if f["targetS"]]
    if any(f["subagents"] >= RSS_TARGET_FROM for f in figures):
        targets.append(f"RSS ≤ {RSS_TARGET_MB:g} MB")
    checks: dict[str, bool] = {}
    for f in figures:
        n = f["subagents"]
        checks[f"accepted{n}"] = bool(f["accepted"])
        checks[f"allAnnounced{n}"] = f["announced"] == n
        checks[f"allOk{n}"] = f["announceStatuses"].get("ok", 0) == n
    return Outcome(
        scenario="fanout",
        title="fan-out",
        figure=figure,
        anchor={
            "what": "computed for the largest size: children one after another, and "
            "OpenClaw's lane of 8",
            "subagents": n_last,
            "sequentialS": sequential_s,
            "openclawLane8S": lane_s,
        },
        ratio=ratio(lane_s, figures[-1]["allAnnouncedS"]),
        ratio_text=f"speed-up over the lane of 8 ({n_last:,} sub-agents)",
        target="; ".join(targets),
        passed=all(verdicts),
        figure_text="; ".join(texts),
        anchor_text=f"{n_last:,}: {sequential_s:,.0f} s sequential, {lane_s:,.1f} s lane of 8",
        parameters={
            "subagents": [f["subagents"] for f in figures],
            "modelLatencyS": MODEL_LATENCY_S,
            "model": "fake OpenAI-compatible server via models.providers (subagents.model)",
            "workers": 1,
            "workerConcurrency": WORKER_CONCURRENCY,
            "workerMaxInFlight": "the worker's default (10,000)",
            "spawn": "one sessions_spawn call over /tools/invoke, tasks=[...], join=each, "
            "per size, one size after the other on the same stack",
            "counted": "announce messages appended to the requester's transcript",
            "rss": "worker process RSS sampled every 50 ms during each size's measurement; "
            "high-water mark: VmHWM (the process's peak since it started); per run in "
            "flight: (peak sampled RSS - RSS before the spawn) / the peak of child runs "
            "running at once (from their startedAt/endedAt)",
            "cpu": "the worker process's user + system CPU seconds over each size's "
            "measurement, per child announced, and divided by the measurement's wall time "
            "(the share of one core it used)",
        },
        checks=checks,
        notes=[f["note"] for f in figures if f["note"]],
    )


def _met(f: dict[str, Any]) -> bool:
    """A size met its time target, and for 10,000 and more the worker's RSS target."""
    ok = f["targetS"] is None or f["allAnnouncedS"] <= f["targetS"]
    if f["subagents"] >= RSS_TARGET_FROM:
        peak = f["workerRssHighWaterMB"] or f["workerPeakRssMB"]
        ok = ok and peak <= RSS_TARGET_MB
    return bool(ok)


def _mb(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} MB"


def _announce_statuses(transcripts: TranscriptStore, baseline: int) -> dict[str, int]:
    """Children by the `Status:` line of their announce in the requester's transcript."""
    counts: dict[str, int] = {}
    for message in transcripts.after(REQUESTER, baseline):
        status = _status_of(str(message.get("content", "")))
        counts[status] = counts.get(status, 0) + 1
    return counts


def _status_of(content: str) -> str:
    for line in content.splitlines():
        if line.startswith("Status: "):
            return line.removeprefix("Status: ").strip()
    return "unknown"


def _failures(transcripts: TranscriptStore, baseline: int, limit: int = 3) -> list[str]:
    """The first announces that were not ``ok`` (what went wrong, for the notes)."""
    out = []
    for message in transcripts.after(REQUESTER, baseline):
        content = str(message.get("content", ""))
        if _status_of(content) != "ok":
            out.append(content[:300])
            if len(out) >= limit:
                break
    return out


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
