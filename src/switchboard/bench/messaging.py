"""Scenarios around `sessions_send`: send+wait latency, throughput, parked waits.

Sends go through `POST /tools/invoke` (or, for parked waits, from inside agent runs) to
fresh target sessions whose model (`builtin/echo`) answers at once. The reply-back loop is
off (`maxPingPongTurns: 0`) so a measurement is one send and its announce, not five extra
ping-pong runs; every send still runs its announce step.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import orjson
import psutil
from rich.progress import Progress

from switchboard.bench.harness import ONE_AGENT_STACK, WORKER_CONCURRENCY, BenchRun, Stack, phase
from switchboard.bench.report import Outcome, latency_summary, ratio
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.runs import TERMINAL

REQUESTER = "agent:main:main"
KS = Keyspace()
_CONCURRENCY = WORKER_CONCURRENCY
_WARM_UP = 10
# How often completion is polled while a burst runs. Figures come from the end times
# recorded in Redis (run `endedAt`, task `date_done`), not from when a poll saw them, so
# polling less often changes no figure; it only takes less CPU from the stack under test
# (a poll of 500 pending runs every 50 ms cost the bench process half a core).
_POLL_S = 0.25


def latency(run: BenchRun) -> Outcome:
    """p50/p99 of a waiting `sessions_send` over HTTP vs a no-op Celery `.delay().get()`."""
    st = run.stacks.get("latency", **ONE_AGENT_STACK)
    return _latency(st, run.progress, 40 if run.quick else 300)


def _latency(st: Stack, progress: Progress, n: int) -> Outcome:
    app = st.anchor_app()
    noop = app.tasks["anchor.noop"]
    with phase(progress, "latency: warm up"):
        st.warm_up()
        st.warm_up_anchor(app)
    bad: list[dict[str, Any]] = []
    with st.http() as http:

        def send(i: int) -> None:
            target = f"agent:main:bench:lat-{i}"
            result = st.tool(
                http,
                "sessions_send",
                REQUESTER,
                sessionKey=target,
                message="ping",
                timeoutSeconds=30,
            )
            if result.get("status") != "ok" or result.get("reply") != "ping":
                bad.append(result)

        def roundtrip() -> None:
            noop.delay().get(timeout=30)

        for i in range(_WARM_UP):
            send(-1 - i)
            roundtrip()
        ours: list[float] = []
        base: list[float] = []
        task = progress.add_task("latency: send+wait / anchor (interleaved)", total=n)
        for i in range(n):  # interleaved, so both see the same noise
            ours.append(_time_ms(partial(send, i)))
            base.append(_time_ms(roundtrip))
            progress.advance(task)
        progress.remove_task(task)
    figure = latency_summary(ours)
    anchor = latency_summary(base)
    r = ratio(figure["p50_ms"], anchor["p50_ms"])
    return Outcome(
        scenario="latency",
        title="send+wait latency",
        figure=figure,
        anchor={"what": "no-op Celery task .delay().get() on the same Redis", **anchor},
        ratio=r,
        ratio_text="p50 / anchor p50",
        target="p50 ≤ 3x anchor p50",
        passed=r <= 3,
        figure_text=f"p50 {figure['p50_ms']:.1f} ms, p99 {figure['p99_ms']:.1f} ms",
        anchor_text=f"p50 {anchor['p50_ms']:.1f} ms",
        parameters={
            "sends": n,
            "path": "POST /tools/invoke sessions_send timeoutSeconds=30",
            "model": "builtin/echo",
            "maxPingPongTurns": 0,
            "workerConcurrency": _CONCURRENCY,
            "anchorConcurrency": _CONCURRENCY,
            "targets": "a fresh session per send",
        },
        checks={"allOk": not bad},
        notes=[f"{len(bad)} send(s) did not answer ok: {bad[:3]}"] if bad else [],
    )


def _time_ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


# -- throughput -------------------------------------------------------------------------


def throughput(run: BenchRun) -> Outcome:
    """Fire-and-forget sends completed per second vs no-op Celery tasks per second.

    Five rounds of a thousand each, product then anchor back to back, medians compared:
    a round of 500 lasted about three seconds, a sixth of which is the pipeline filling
    (nothing ends until the first runs have crossed api, broker and worker) and the last
    runs draining, so it measured the ramp as much as the rate; and on a shared machine
    single rounds of either side range widely (the anchor 319-435 tasks/s in one run, the
    product's ratio 0.42-0.62 over nine rounds of the same code), so the median of five
    moves less than that of three."""
    n, rounds = (150, 1) if run.quick else (1000, 5)
    progress = run.progress
    st = run.stacks.get("throughput", **ONE_AGENT_STACK)
    app = st.anchor_app()
    with phase(progress, "throughput: warm up"):
        st.warm_up()
        st.warm_up_anchor(app)
        st.wait_idle()
    ours: list[float] = []
    base: list[float] = []
    incomplete = 0
    for round_no in range(rounds):
        label = f"throughput round {round_no + 1}/{rounds}"
        rate, missing = _product_rate(st, progress, n, f"{label}: sends", tag=str(round_no))
        ours.append(rate)
        incomplete += missing
        with phase(progress, f"{label}: wait for follow-ups (announces) to drain"):
            st.wait_idle()
        base.append(_anchor_rate(st, app, progress, n, f"{label}: anchor no-op tasks"))
    rate, anchor_rate = round(_median(ours), 1), round(_median(base), 1)
    figure = {"sendsPerS": rate, "rounds": [round(x, 1) for x in ours]}
    anchor = {"tasksPerS": anchor_rate, "rounds": [round(x, 1) for x in base]}
    r = ratio(rate, anchor_rate)
    return Outcome(
        scenario="throughput",
        title="throughput",
        figure=figure,
        anchor={"what": "no-op Celery tasks completed per second, same concurrency", **anchor},
        ratio=r,
        ratio_text="sends/s / anchor tasks/s",
        target="≥ 50% of anchor",
        passed=r >= 0.5,
        figure_text=f"{rate:.0f} sends/s",
        anchor_text=f"{anchor_rate:.0f} tasks/s",
        parameters={
            "sendsPerRound": n,
            "rounds": rounds,
            "path": "POST /tools/invoke sessions_send timeoutSeconds=0, 32 requests in flight",
            "completion": "target run status terminal in Redis (transcript written)",
            "model": "builtin/echo",
            "maxPingPongTurns": 0,
            "workerConcurrency": _CONCURRENCY,
            "anchorConcurrency": _CONCURRENCY,
            "workers": 1,
        },
        checks={"allCompleted": incomplete == 0},
        notes=[f"{incomplete} send(s) did not complete ok"] if incomplete else [],
    )


def _product_rate(
    st: Stack, progress: Progress, n: int, label: str, *, tag: str
) -> tuple[float, int]:
    """Sends per second from the first request to the last target run's end; (rate, bad)."""
    task = progress.add_task(label, total=n)
    t0_ms = time.time() * 1000

    async def fire() -> list[str]:
        async with st.async_http() as http:
            gate = asyncio.Semaphore(32)

            async def one(i: int) -> str:
                body = {
                    "tool": "sessions_send",
                    "sessionKey": REQUESTER,
                    "args": {
                        "sessionKey": f"agent:main:bench:tp-{tag}-{i}",
                        "message": "ping",
                        "timeoutSeconds": 0,
                    },
                }
                async with gate, http.post("/tools/invoke", json=body) as resp:
                    resp.raise_for_status()
                    return str((await resp.json())["result"]["runId"])

            return await asyncio.gather(*(one(i) for i in range(n)))

    run_ids = asyncio.run(fire())
    progress.update(task, description=f"{label}: waiting for runs")
    ended = _wait_runs(st, run_ids, progress, task, timeout_s=300)
    progress.remove_task(task)
    ok = [end for status, end in ended.values() if status == "ok"]
    with st.client() as r:
        pipe = r.pipeline(transaction=False)
        for i in range(n):
            pipe.xlen(KS.transcript(f"agent:main:bench:tp-{tag}-{i}"))
        written = sum(int(x) >= 2 for x in pipe.execute())
    bad = n - min(len(ok), written)
    span_s = (max(ok) - t0_ms) / 1000 if ok else float("inf")
    return len(ok) / span_s, bad


def _wait_runs(
    st: Stack, run_ids: Sequence[str], progress: Progress, task: Any, *, timeout_s: float
) -> dict[str, tuple[str, int]]:
    """Poll run records until every run is terminal; run id → (status, endedAt ms)."""
    pending = set(run_ids)
    done: dict[str, tuple[str, int]] = {}
    deadline = time.monotonic() + timeout_s
    with st.client() as r:
        while pending and time.monotonic() < deadline:
            ids = list(pending)
            pipe = r.pipeline(transaction=False)
            for run_id in ids:
                pipe.hmget(KS.run(run_id), "status", "endedAt")
            for run_id, (status, ended) in zip(ids, pipe.execute(), strict=True):
                if status is not None and status.decode() in TERMINAL:
                    done[run_id] = (status.decode(), int(ended or 0))
                    pending.discard(run_id)
            progress.update(task, completed=len(done))
            if pending:
                st.check_alive()
                time.sleep(_POLL_S)
    return done


def _anchor_rate(st: Stack, app: Any, progress: Progress, n: int, label: str) -> float:
    """No-op tasks per second from the first `.delay()` to the last task's `date_done`."""
    task = progress.add_task(label, total=n)
    noop = app.tasks["anchor.noop"]
    t0 = dt.datetime.now(dt.UTC)
    ids = [noop.delay().id for _ in range(n)]
    keys = [f"celery-task-meta-{task_id}" for task_id in ids]
    finished: dict[str, dt.datetime] = {}
    deadline = time.monotonic() + 300
    with st.client() as r:
        while len(finished) < n and time.monotonic() < deadline:
            pending = [k for k in keys if k not in finished]
            for key, raw in zip(pending, r.mget(pending), strict=True):
                if raw is not None:
                    meta = orjson.loads(raw)
                    done_at = dt.datetime.fromisoformat(meta["date_done"])
                    finished[key] = done_at if done_at.tzinfo else done_at.replace(tzinfo=dt.UTC)
            progress.update(task, completed=len(finished))
            if len(finished) < n:
                time.sleep(_POLL_S)
    progress.remove_task(task)
    if len(finished) < n:
        raise TimeoutError(f"anchor: only {len(finished)}/{n} no-op tasks finished")
    span_s = (max(finished.values()) - t0).total_seconds()
    return n / span_s


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# -- parked waits -------------------------------------------------------------------------

_PARKED_CONCURRENCY = 4
_PARKED_RSS_LIMIT_MB = 300
_TWO_AGENTS = {
    "agents": {"list": [{"id": "a", "default": True}, {"id": "b"}]},
    "session": {"agentToAgent": {"maxPingPongTurns": 0}},
    "tools": {
        "sessions": {"visibility": "all"},
        "agentToAgent": {"enabled": True, "allow": ["a", "b"]},
    },
}


def parked(run: BenchRun) -> Outcome:
    """Waiting sends from agent A's runs to agent B, all at once, on a 4-thread worker."""
    n = 100 if run.quick else 1000
    wait_s = 600
    progress = run.progress
    st = run.stacks.get("parked", config=_TWO_AGENTS, worker_concurrency=_PARKED_CONCURRENCY)
    with phase(progress, "parked: warm up"):
        st.warm_up(session_key="agent:a:bench-warmup")
    worker = psutil.Process(st.pid("worker0"))
    sampler = _Sampler(st, worker)
    sampler.start()
    t0 = time.monotonic()
    try:
        run_ids = _start_waiting_runs(st, n, wait_s)
        task = progress.add_task("parked: A runs (each waits on a send to B)", total=n)
        ended = _wait_runs(st, run_ids, progress, task, timeout_s=wait_s)
        progress.remove_task(task)
    finally:
        sampler.stop()
    elapsed_s = time.monotonic() - t0
    statuses = _send_statuses(st, run_ids)
    completed = sum(1 for status, _ in ended.values() if status == "ok")
    timeouts = statuses.get("timeout", 0)
    send_ok = statuses.get("ok", 0)
    rss_mb = sampler.peak_rss / 2**20
    figure = {
        "waitingSends": n,
        "completed": completed,
        "sendsOk": send_ok,
        "timeouts": timeouts,
        "sendStatuses": statuses,
        "peakParkedRuns": sampler.peak_parked,
        "peakWorkerRssMB": round(rss_mb, 1),
        "wallS": round(elapsed_s, 1),
    }
    return Outcome(
        scenario="parked",
        title="parked waits",
        figure=figure,
        anchor={"what": "none (a wait that held a worker thread would finish 4 at a time)"},
        ratio=None,
        target=f"all complete, 0 timeouts, worker RSS ≤ {_PARKED_RSS_LIMIT_MB} MB",
        passed=rss_mb <= _PARKED_RSS_LIMIT_MB,
        figure_text=(
            f"{send_ok}/{n} ok, {timeouts} timeouts, peak {sampler.peak_parked} parked, "
            f"RSS {rss_mb:.0f} MB, {elapsed_s:.0f} s"
        ),
        anchor_text="—",
        parameters={
            "waitingSends": n,
            "timeoutSeconds": wait_s,
            "workerConcurrency": _PARKED_CONCURRENCY,
            "workers": 1,
            "how": "agent a runs call sessions_send to agent b (echo /tool directive)",
            "model": "builtin/echo",
            "maxPingPongTurns": 0,
            "rss": "worker process and its children, sampled every 0.2 s",
        },
        checks={"allComplete": completed == n and send_ok == n, "noTimeouts": timeouts == 0},
    )


def _start_waiting_runs(st: Stack, n: int, wait_s: int) -> list[str]:
    """Start n runs of agent a, each calling sessions_send to its own session of agent b."""

    async def fire() -> list[str]:
        async with st.async_http() as http:
            gate = asyncio.Semaphore(16)

            async def one(i: int) -> str:
                args = {"sessionKey": f"agent:b:bench:p-{i}", "message": "pong"}
                args["timeoutSeconds"] = wait_s  # type: ignore[assignment]
                message = f"/tool sessions_send {json.dumps(args)}"
                body = {
                    "method": "agent",
                    "params": {"sessionKey": f"agent:a:bench:p-{i}", "message": message},
                }
                async with gate, http.post("/rpc", json=body) as resp:
                    resp.raise_for_status()
                    return str((await resp.json())["runId"])

            return await asyncio.gather(*(one(i) for i in range(n)))

    return asyncio.run(fire())


def _send_statuses(st: Stack, run_ids: Sequence[str]) -> dict[str, int]:
    """How each A run's sessions_send ended, read from the run's reply (the tool's JSON)."""
    counts: dict[str, int] = {}
    with st.client() as r:
        pipe = r.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hget(KS.run(run_id), "reply")
        for raw in pipe.execute():
            try:
                status = str(orjson.loads(raw).get("status")) if raw else "no reply"
            except orjson.JSONDecodeError:
                status = "unreadable"
            counts[status] = counts.get(status, 0) + 1
    return counts


class _Sampler(threading.Thread):
    """Samples the worker's RSS (with children) and the parked-run count, keeping peaks."""

    def __init__(self, st: Stack, worker: psutil.Process) -> None:
        super().__init__(daemon=True, name="bench-sampler")
        self.st, self.worker = st, worker
        self.peak_rss = 0
        self.peak_parked = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        with self.st.client() as r:
            while not self._stop_event.wait(0.2):
                self.peak_rss = max(self.peak_rss, _rss(self.worker))
                self.peak_parked = max(self.peak_parked, int(r.zcard(KS.parked_runs)))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def _rss(proc: psutil.Process) -> int:
    try:
        procs = [proc, *proc.children(recursive=True)]
        return sum(p.memory_info().rss for p in procs)
    except psutil.Error:
        return 0
