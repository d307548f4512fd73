"""Batch: one OpenAI Batches API batch of many lines whose model takes one second.

The lines' agent uses the project's fake OpenAI-compatible server with 1 s latency (through
`models.providers`), one worker runs them, at most `batches.maxConcurrent` at once (`CAP`).
The figure is the time from the batch's creation (its file uploaded already) until it is
`completed`, with every line in its output file once. Beside it: the upload and the
create call (the check of every line), the worker's peak RSS, the Redis memory per line
(everything the batch left: its file, plans, output, and each line's session, transcript
and run record), and the p50 of an interactive send+wait to the same agent while the batch
runs, against the same p50 idle (the batch's runs go to a queue of their own). The anchor
is computed: the lines one after another, and OpenClaw's lane of 8.
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import threading
import time
from typing import Any

import openai
import psutil

from switchboard_bench.fanout import RssSamples
from switchboard_bench.harness import TOKEN, WORKER_CONCURRENCY, BenchRun, Stack, fake_model, phase
from switchboard_bench.report import Outcome, ratio

MODEL_LATENCY_S = 1.0
CAP = 1000
SIZE = 10_000
QUICK_SIZE = 200
TARGET_S = 30.0
RSS_TARGET_MB = 500.0
# The interactive send+wait p50 while the batch runs, at most this many times idle's.
INTERACTIVE_TARGET = 2.0
IDLE_SENDS = 10
INTERACTIVE = "agent:main:bench-interactive"
OPENCLAW_LANE = 8


def batch(run: BenchRun) -> Outcome:
    """Time one batch of ``SIZE`` lines end to end; memory and interactive latency beside."""
    n = QUICK_SIZE if run.quick else SIZE
    with contextlib.ExitStack() as exits:
        with phase(run.progress, "batch: start the fake model server"):
            base_url = exits.enter_context(fake_model(MODEL_LATENCY_S * 1000))
        exits.callback(run.stacks.close)  # its config names this model server
        st = run.stacks.get(
            "batch", config=_config(base_url), worker_concurrency=WORKER_CONCURRENCY
        )
        with phase(run.progress, "batch: warm up"):
            st.warm_up()
        idle = [_send_wait(st, i) for i in range(IDLE_SENDS)]
        figure = _measure(st, run, n)
        figure["interactiveIdleP50S"] = round(statistics.median(idle), 3)
        return _outcome(figure, n)


def _config(base_url: str) -> dict[str, Any]:
    provider = {"baseUrl": base_url, "apiKey": "bench", "api": "openai-completions"}
    return {
        "models": {"providers": {"fake": provider}},
        "agents": {"defaults": {"model": "fake/fake-model"}},
        "batches": {"maxConcurrent": CAP},
    }


def _send_wait(st: Stack, i: int) -> float:
    """One interactive send and wait for its reply; seconds."""
    t0 = time.monotonic()
    with st.http() as http:
        started = st.rpc(http, "agent", sessionKey=INTERACTIVE, message=f"ping {i}")
        st.rpc(http, "agent.wait", runId=started["runId"], timeoutMs=60_000)
    return time.monotonic() - t0


def _lines(n: int) -> bytes:
    body = {"model": "switchboard/main", "messages": [{"role": "user", "content": "summarise"}]}
    return b"".join(
        json.dumps(
            {"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        ).encode()
        + b"\n"
        for i in range(n)
    )


def _measure(st: Stack, run: BenchRun, n: int) -> dict[str, Any]:
    client = openai.OpenAI(base_url=f"{st.api_url}/v1", api_key=TOKEN, timeout=600)
    redis_before = st.store().stats.memory_bytes()
    data = _lines(n)
    t0 = time.monotonic()
    uploaded = client.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch")
    upload_s = time.monotonic() - t0
    task = run.progress.add_task(f"batch: {n:,} lines", total=n)
    interactive: list[float] = []
    stop = threading.Event()

    def sends() -> None:
        i = 0
        while not stop.is_set():
            interactive.append(_send_wait(st, 1000 + i))
            i += 1

    worker = psutil.Process(st.pid("worker0"))
    with RssSamples(worker.pid) as memory:
        t1 = time.monotonic()
        created = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        create_s = time.monotonic() - t1
        sender = threading.Thread(target=sends, daemon=True)
        sender.start()
        batch = created
        deadline = t1 + 900
        while batch.status not in ("completed", "failed", "cancelled", "expired"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
            st.check_alive()
            batch = client.batches.retrieve(created.id)
            counts = batch.request_counts
            run.progress.update(task, completed=(counts.completed + counts.failed) if counts else 0)
        total_s = time.monotonic() - t1
        stop.set()
        sender.join(120)
    run.progress.remove_task(task)
    out = (
        client.files.content(batch.output_file_id).text.splitlines() if batch.output_file_id else []
    )
    ids = {json.loads(line)["custom_id"] for line in out}
    redis_after = st.store().stats.memory_bytes()
    hwm = memory.high_water_mark()
    counts = batch.request_counts
    return {
        "lines": n,
        "status": batch.status,
        "completed": counts.completed if counts else 0,
        "failed": counts.failed if counts else 0,
        "distinctOutputLines": len(ids),
        "outputLines": len(out),
        "batchS": round(total_s, 2),
        "uploadS": round(upload_s, 2),
        "createCallS": round(create_s, 2),
        "targetS": TARGET_S if n >= SIZE else None,
        "workerPeakRssMB": round(memory.peak / 2**20, 1),
        "workerRssHighWaterMB": None if hwm is None else round(hwm / 2**20, 1),
        "redisBytesPerLine": round((redis_after - redis_before) / n),
        "interactiveSends": len(interactive),
        "interactiveP50S": round(statistics.median(interactive), 3) if interactive else None,
    }


def _outcome(f: dict[str, Any], n: int) -> Outcome:
    sequential_s = n * MODEL_LATENCY_S
    lane_s = n / OPENCLAW_LANE * MODEL_LATENCY_S
    rss = f["workerRssHighWaterMB"] or f["workerPeakRssMB"]
    slowdown = (
        f["interactiveP50S"] / f["interactiveIdleP50S"]
        if f["interactiveP50S"] and f["interactiveIdleP50S"]
        else None
    )
    f["interactiveSlowdown"] = None if slowdown is None else round(slowdown, 2)
    passed = (
        (f["targetS"] is None or f["batchS"] <= f["targetS"])
        and rss <= RSS_TARGET_MB
        and (slowdown is None or slowdown <= INTERACTIVE_TARGET)
    )
    return Outcome(
        scenario="batch",
        title="batch (Batches API)",
        figure=f,
        anchor={
            "what": "computed: the lines one after another, and OpenClaw's lane of 8",
            "lines": n,
            "sequentialS": sequential_s,
            "openclawLane8S": lane_s,
        },
        ratio=ratio(lane_s, f["batchS"]),
        ratio_text=f"speed-up over the lane of 8 ({n:,} lines)",
        target=f"{SIZE:,} lines ≤ {TARGET_S:g} s; RSS ≤ {RSS_TARGET_MB:g} MB; interactive "
        f"p50 ≤ {INTERACTIVE_TARGET:g}x idle",
        passed=passed,
        figure_text=(
            f"{f['distinctOutputLines']:,}/{n:,} lines answered in {f['batchS']:.1f} s (upload "
            f"{f['uploadS']:.1f} s, create {f['createCallS']:.1f} s; worker peak RSS {rss:.0f} MB; "
            f"Redis {f['redisBytesPerLine']:,} B per line; interactive send+wait p50 "
            f"{f['interactiveP50S']} s against {f['interactiveIdleP50S']} s idle)"
        ),
        anchor_text=f"{n:,}: {sequential_s:,.0f} s sequential, {lane_s:,.1f} s lane of 8",
        parameters={
            "lines": n,
            "maxConcurrent": CAP,
            "modelLatencyS": MODEL_LATENCY_S,
            "model": "fake OpenAI-compatible server via models.providers (agents.defaults.model)",
            "workers": 1,
            "workerConcurrency": WORKER_CONCURRENCY,
            "client": "the openai SDK: files.create, batches.create, batches.retrieve every "
            "0.2 s, files.content",
            "interactive": f"send+wait (rpc agent, agent.wait) to {INTERACTIVE}, one after "
            f"another: {IDLE_SENDS} before the batch (idle), and throughout it",
        },
        checks={
            "completed": f["status"] == "completed",
            "everyLineOnce": f["distinctOutputLines"] == n and f["outputLines"] == n,
            "noneFailed": f["failed"] == 0,
        },
    )
