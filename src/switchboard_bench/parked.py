"""Parked waits: many waiting `sessions_send` calls from agent A's runs to agent B at once.

A waiting send parks its run (the run holds no worker thread while it waits), so a worker
with four threads holds far more waits than four; the figure is that all complete, with
no timeouts, and what the worker's memory peaked at.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence

import orjson
import psutil

from switchboard_bench.harness import BenchRun, Stack, phase
from switchboard_bench.messaging import wait_runs
from switchboard_bench.report import Outcome

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
        ended = wait_runs(st, run_ids, progress, task, timeout_s=wait_s)
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
    for record in st.store().runs.get_many(run_ids):
        raw = record.reply if record is not None else None
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
        self.worker = worker
        self.progress = st.store().progress  # made here: the store is not made in two threads
        self.peak_rss = 0
        self.peak_parked = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.2):
            self.peak_rss = max(self.peak_rss, _rss(self.worker))
            self.peak_parked = max(self.peak_parked, self.progress.parked_runs())

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def _rss(proc: psutil.Process) -> int:
    try:
        procs = [proc, *proc.children(recursive=True)]
        return sum(p.memory_info().rss for p in procs)
    except psutil.Error:
        return 0
