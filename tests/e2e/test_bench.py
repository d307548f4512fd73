"""`switchboard bench --quick` as a user runs it: every scenario completes and writes its JSON.

A smoke test of the benchmark suite, not of speed: it checks that each scenario ran to the
end with every count complete and no timeouts, and that its figures are well-formed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

SCENARIOS = ("latency", "throughput", "listing", "history", "fanout", "parked")


def _bench(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "bench", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One `switchboard bench --quick` into a fresh directory; (out dir, its output)."""
    out = tmp_path_factory.mktemp("bench")
    done = _bench("--quick", "--out", str(out), timeout_s=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return out, output


def _figures(out: Path, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
    return doc


@pytest.mark.timeout(900)
def test_quick_suite_writes_every_scenario(quick_run: tuple[Path, str]) -> None:
    """Each scenario writes `<name>.json` with figure, anchor, target, verdict and machine."""
    out, output = quick_run
    assert sorted(p.name for p in out.glob("*.json")) == sorted(f"{n}.json" for n in SCENARIOS)
    for name in SCENARIOS:
        doc = _figures(out, name)
        assert doc["scenario"] == name
        assert doc["quick"] is True
        assert isinstance(doc["pass"], bool)
        assert doc["target"]
        assert doc["checks"] and all(doc["checks"].values()), (name, doc["checks"])
        assert doc["correct"] is True
        assert doc["parameters"]
        assert doc["machine"]["cpuCount"] >= 1 and doc["machine"]["python"]
        assert doc["summary"] and doc["anchorSummary"]
        assert f"\n│ {name} " in output  # its row of the final table


@pytest.mark.timeout(900)
def test_latency_and_throughput_figures_are_measured(quick_run: tuple[Path, str]) -> None:
    """Latency has samples on both sides; throughput counted sends and anchor tasks."""
    out, _ = quick_run
    latency = _figures(out, "latency")
    assert latency["figure"]["n"] == latency["anchor"]["n"] == latency["parameters"]["sends"]
    assert 0 < latency["figure"]["p50_ms"] <= latency["figure"]["p99_ms"]
    assert latency["anchor"]["p50_ms"] > 0
    assert latency["ratio"] == pytest.approx(
        latency["figure"]["p50_ms"] / latency["anchor"]["p50_ms"], rel=0.01
    )
    throughput = _figures(out, "throughput")
    assert throughput["figure"]["sendsPerS"] > 0
    assert throughput["anchor"]["tasksPerS"] > 0


@pytest.mark.timeout(900)
def test_scale_scenarios_load_and_agree_with_the_full_scan(quick_run: tuple[Path, str]) -> None:
    """Listing ran over the loaded sessions and returned what a full scan finds."""
    out, _ = quick_run
    listing = _figures(out, "listing")
    assert listing["parameters"]["sessionsStored"] >= 20_000
    assert listing["checks"]["sameAsFullScan"] is True
    assert listing["figure"]["http"]["p50_ms"] > 0
    history = _figures(out, "history")
    assert history["parameters"]["transcriptMessages"] >= 10_000
    assert history["anchor"]["p50_ms"] > history["figure"]["p50_ms"] > 0


@pytest.mark.timeout(900)
def test_fanout_and_parked_complete_without_timeouts(quick_run: tuple[Path, str]) -> None:
    """Every sub-agent announced back ok; every parked waiting send answered ok."""
    out, _ = quick_run
    fanout = _figures(out, "fanout")["figure"]
    assert fanout["announced"] == fanout["subagents"] == 100
    assert fanout["announceStatuses"] == {"ok": 100}
    parked = _figures(out, "parked")["figure"]
    assert parked["completed"] == parked["sendsOk"] == parked["waitingSends"] == 100
    assert parked["timeouts"] == 0
    assert parked["peakWorkerRssMB"] > 0
    assert parked["peakParkedRuns"] > 4, "waits did not overlap beyond the worker's 4 threads"


def test_unknown_scenario_is_a_clear_error(tmp_path: Path) -> None:
    """A misspelt scenario exits 2 naming the known ones, without a stack trace."""
    done = _bench("--quick", "-s", "latncy", "--out", str(tmp_path), timeout_s=120)
    assert done.returncode == 2
    assert "unknown scenario" in done.stderr and "latency" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.json"))
