"""Benchmark scenarios; each measures the product and its anchor side by side in one run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from rich.progress import Progress

from switchboard.bench.harness import Stack


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0..100) of the samples, nearest rank."""
    ordered = sorted(samples)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def _timed(n: int, fn: Callable[[], None], progress: Progress, label: str) -> list[float]:
    task = progress.add_task(label, total=n)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
        progress.advance(task)
    return out


def roundtrip(st: Stack, progress: Progress, *, n: int) -> dict[str, Any]:
    """p50/p99 of `agent` + `agent.wait` (echo model) vs a no-op Celery `.delay().get()`."""
    from switchboard.bench.anchor import app as anchor_app

    anchor_app.conf.broker_url = st.redis.url
    anchor_app.conf.result_backend = st.redis.url
    noop = anchor_app.tasks["anchor.noop"]
    http = st.http()

    def product() -> None:
        started = http.post(
            "/rpc", json={"method": "agent", "params": {"sessionKey": "main", "message": "ping"}}
        ).json()
        outcome = http.post(
            "/rpc",
            json={
                "method": "agent.wait",
                "params": {"runId": started["runId"], "timeoutMs": 30000},
            },
        ).json()
        if outcome.get("status") != "ok":
            raise RuntimeError(f"run did not succeed: {outcome}")

    def anchor() -> None:
        noop.delay().get(timeout=30)

    for _ in range(10):  # warm up both paths (connections, imports, model cache)
        product()
        anchor()
    ours = _timed(n, product, progress, "agent + agent.wait")
    base = _timed(n, anchor, progress, "anchor: noop.delay().get()")
    p50, anchor_p50 = statistics.median(ours), statistics.median(base)
    return {
        "scenario": "roundtrip",
        "n": n,
        "p50_ms": round(p50, 2),
        "p99_ms": round(percentile(ours, 99), 2),
        "anchor_p50_ms": round(anchor_p50, 2),
        "anchor_p99_ms": round(percentile(base, 99), 2),
        "ratio_p50": round(p50 / anchor_p50, 2),
    }
