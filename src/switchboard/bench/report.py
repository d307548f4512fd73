"""What a scenario reports: its figure, its anchor, the ratio, the target and the verdict.

Every scenario returns one `Outcome`; `run_bench` writes it as `<scenario>.json` (with the
machine it was measured on) and as one row of the final table.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from switchboard import __version__


@dataclass
class Outcome:
    """One scenario's result.

    ``checks`` are correctness facts (everything completed, no timeouts); a failed check
    fails the run in every mode. ``passed`` is the speed target, judged on the figures.
    """

    scenario: str
    title: str
    figure: dict[str, Any]
    anchor: dict[str, Any]
    ratio: float | None
    target: str
    passed: bool
    figure_text: str
    anchor_text: str
    ratio_text: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def correct(self) -> bool:
        """Every correctness check held."""
        return all(self.checks.values())

    def to_json(self, *, quick: bool, machine: dict[str, Any], duration_s: float) -> dict[str, Any]:
        """The JSON document written to ``<out>/<scenario>.json``."""
        return {
            "scenario": self.scenario,
            "title": self.title,
            "summary": self.figure_text,
            "anchorSummary": self.anchor_text,
            "figure": self.figure,
            "anchor": self.anchor,
            "ratio": self.ratio,
            "ratioMeaning": self.ratio_text,
            "target": self.target,
            "pass": self.passed,
            "checks": self.checks,
            "correct": self.correct,
            "quick": quick,
            "parameters": self.parameters,
            "notes": self.notes,
            "durationS": round(duration_s, 1),
            "measuredAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine,
        }


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of the samples, nearest rank."""
    ordered = sorted(samples)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def latency_summary(samples_ms: Sequence[float]) -> dict[str, float]:
    """n, p50, p90, p99, mean and max of latency samples (ms, 3 decimals)."""
    return {
        "n": len(samples_ms),
        "p50_ms": round(statistics.median(samples_ms), 3),
        "p90_ms": round(percentile(samples_ms, 90), 3),
        "p99_ms": round(percentile(samples_ms, 99), 3),
        "mean_ms": round(statistics.fmean(samples_ms), 3),
        "max_ms": round(max(samples_ms), 3),
    }


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, rounded; infinity when the denominator is zero."""
    return round(numerator / denominator, 3) if denominator > 0 else float("inf")


def machine_info(redis_version: str | None = None) -> dict[str, Any]:
    """What the figures were measured on; the machine may be shared, hence the load."""
    memory = psutil.virtual_memory()
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpuCount": os.cpu_count(),
        "memoryGiB": round(memory.total / 2**30, 1),
        "loadAverage": [round(x, 2) for x in os.getloadavg()],
        "redis": redis_version,
        "switchboard": __version__,
        "commit": _git_commit(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None
