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

SCENARIOS = ("latency", "throughput", "listing", "history", "fanout", "parked", "tools")


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
    readme = (out / "README.md").read_text()
    assert all(f"| {name} |" in readme for name in SCENARIOS)
    assert "Quick run: speed not judged." in readme
    assert "(fireAndForget)" in readme and "(sendWait)" in readme


@pytest.mark.timeout(900)
def test_latency_and_throughput_figures_are_measured(quick_run: tuple[Path, str]) -> None:
    """Latency has samples on every side; throughput counted sends and anchor tasks; both
    judge against the faster of the two anchors."""
    out, _ = quick_run
    latency = _figures(out, "latency")
    figure, anchor = latency["figure"], latency["anchor"]
    assert figure["n"] == anchor["n"] == latency["parameters"]["sends"]
    assert anchor["prefork"]["n"] == anchor["threads"]["n"] == figure["n"]  # both reported
    assert 0 < figure["p50_ms"] <= figure["p99_ms"]
    fastest = min(("prefork", "threads"), key=lambda name: anchor[name]["p50_ms"])
    assert anchor["fasterAnchor"] == fastest
    assert anchor["p50_ms"] == anchor[fastest]["p50_ms"] > 0
    assert latency["ratio"] == pytest.approx(figure["p50_ms"] / anchor["p50_ms"], rel=0.01)
    throughput = _figures(out, "throughput")
    assert throughput["figure"]["sendsPerS"] > 0
    rates = {name: throughput["anchor"][name]["tasksPerS"] for name in ("prefork", "threads")}
    assert min(rates.values()) > 0
    assert throughput["anchor"]["fasterAnchor"] == max(rates, key=lambda name: rates[name])
    assert throughput["anchor"]["tasksPerS"] == max(rates.values())


@pytest.mark.timeout(900)
def test_latency_into_a_session_holding_a_thousand_messages(quick_run: tuple[Path, str]) -> None:
    """The long-session figure is measured into 1,000 loaded messages, with its ratio to fresh."""
    out, _ = quick_run
    figure = _figures(out, "latency")["figure"]
    held = figure["longSession"]
    assert held["messagesBefore"] >= 1000
    assert held["n"] == figure["n"] and held["p50_ms"] > 0
    assert held["ratioToFresh"] == pytest.approx(held["p50_ms"] / figure["p50_ms"], rel=0.01)


def test_latency_says_where_a_send_waits(quick_run: tuple[Path, str]) -> None:
    """The fresh sends' time is split into legs by their run records' times: every timed
    send is counted, and the legs add up to the send's own time."""
    out, _ = quick_run
    figure = _figures(out, "latency")["figure"]
    phases = figure["phases"]
    legs = ["toRecordedMs", "recordedToClaimedMs", "claimedToEndedMs", "endedToAnswerMs"]
    assert phases["n"] == figure["n"]
    assert all(phases[leg] > -1 for leg in legs)  # whole-ms run times against a float clock
    assert phases["recordedToClaimedMs"] > 0 and phases["endedToAnswerMs"] > 0
    total = sum(phases[leg] for leg in legs)
    assert total == pytest.approx(figure["mean_ms"], rel=0.2, abs=0.5)


@pytest.mark.timeout(900)
def test_per_run_costs_count_redis_commands_and_cpu(quick_run: tuple[Path, str]) -> None:
    """Commands per fire-and-forget run and per send+wait, and CPU per 1,000 runs, are measured;
    a product run costs more Redis commands than a no-op Celery task."""
    out, _ = quick_run
    costs = _figures(out, "throughput")["costs"]
    run = costs["fireAndForget"]
    assert run["units"] == 150
    assert run["redisCommands"] > costs["anchor.prefork"]["redisCommands"] > 0
    assert run["scriptCalls"] > 0
    assert run["cpuSPer1000"] > 0
    send_wait = _figures(out, "latency")["costs"]["sendWait"]
    assert send_wait["redisCommands"] > 0 and send_wait["units"] > 0
    # Which step runs them: every step of a send has its share, the scripts named.
    steps = send_wait["steps"]["steps"]
    for step in ("submit", "message", "claim", "end", "announce", "delivery"):
        assert steps[step]["redisCommands"] > 0, step
    assert "finish_run" in steps["end"]["by"] and "start_run" in steps["announce"]["by"]
    assert "| submit |" in (out / "README.md").read_text()


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
    # The worker's CPU over the measurement: it ran the children, so it cannot be nothing.
    assert fanout["workerCpuS"] > 0
    assert fanout["workerCpuMsPerChild"] == round(fanout["workerCpuS"] * 1000 / 100, 2)
    assert 0 < fanout["workerCoreShare"] <= len(os.sched_getaffinity(0)) + 0.5
    parked = _figures(out, "parked")["figure"]
    assert parked["completed"] == parked["sendsOk"] == parked["waitingSends"] == 100
    assert parked["timeouts"] == 0
    assert parked["peakWorkerRssMB"] > 0
    assert parked["peakParkedRuns"] > 4, "waits did not overlap beyond the worker's 4 threads"


@pytest.mark.timeout(900)
def test_tools_sub_agents_call_the_capped_server_within_its_cap(
    quick_run: tuple[Path, str],
) -> None:
    """Every sub-agent's MCP call reached the server and answered ok, never more than
    maxConcurrent at once; the overhead was measured for each call."""
    out, _ = quick_run
    tools = _figures(out, "tools")["figure"]
    assert tools["announced"] == tools["subagents"] == tools["callsAtServer"] == 100
    assert tools["callOutcomes"] == {"ok": 100}
    assert 1 < tools["maxInFlightAtServer"] <= 50
    assert tools["overheadSamples"] == 100 and tools["overheadMs"]["p50_ms"] >= 0


def test_unknown_scenario_is_a_clear_error(tmp_path: Path) -> None:
    """A misspelt scenario exits 2 naming the known ones, without a stack trace."""
    done = _bench("--quick", "-s", "latncy", "--out", str(tmp_path), timeout_s=120)
    assert done.returncode == 2
    assert "unknown scenario" in done.stderr and "latency" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.timeout(900)
def test_quick_scale_measures_every_shape_beside_its_anchor(tmp_path: Path) -> None:
    """`-s scale` (not in the default run) measures 1x1, 1x2 and 2x2 on Redis, where
    RabbitMQ is installed on RabbitMQ, and with the state on a 3-primary Redis Cluster
    (the broker on the stack's Redis), each beside the prefork anchor on the same broker;
    two apis both took load; the cluster rows count the broker's Redis and the nodes."""
    done = _bench("--quick", "-s", "scale", "--out", str(tmp_path), timeout_s=900)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = _figures(tmp_path, "scale")
    assert doc["correct"] is True and doc["quick"] is True
    rows = doc["figure"]["shapes"]
    measured = [r for r in rows if "skipped" not in r]
    shapes = {(r["broker"], r["store"], r["apis"], r["workers"]) for r in measured}
    for store in ("redis", "redis-cluster-3"):
        assert {("redis", store, 1, 1), ("redis", store, 1, 2), ("redis", store, 2, 2)} <= shapes
    rabbit = [r for r in rows if r["broker"] == "rabbitmq"]
    assert len(rabbit) == 3 or (len(rabbit) == 1 and rabbit[0]["skipped"]), rabbit
    for r in measured:
        assert r["completed"] == r["sends"] > 0 and r["sendWaitNotOk"] == 0
        assert r["runsPerS"] > 0 and r["sendWait"]["p50_ms"] > 0
        assert r["anchor"]["tasksPerS"] > 0 and r["anchor"]["roundTrip"]["p50_ms"] > 0
        assert r["costs"]["redisCommands"] > r["anchorCosts"]["redisCommands"] > 0
        assert r["cpuMsPerRun"]["worker"] > 0
        if r["apis"] == 2:
            assert all(share and share >= 0.1 for share in r["apiCpuShare"].values()), r
    cluster = [r for r in rows if r["store"] == "redis-cluster-3"]
    assert len(cluster) == 3 and all("skipped" not in r for r in cluster), cluster
    for r in cluster:
        assert r["broker"] == "redis"
        assert r["completed"] == r["sends"] > 0
        assert r["runsPerS"] > 0 and r["sendWait"]["p50_ms"] > 0
        assert r["costs"]["redisCommands"] > 0
        # Its Redis figures are the broker's Redis and the cluster's nodes together.
        assert "cluster" in r["redisCounted"]
        assert set(r["redisCpuMsPerRun"]) == {"redis", "redis-cluster"}
        assert r["redisCpuMsPerRun"]["redis-cluster"] > 0
    assert "| 2x2 |" in (tmp_path / "README.md").read_text()
