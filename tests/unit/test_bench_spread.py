"""The scale scenario's split of the state over a cluster's primaries, and its report."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from switchboard.shared.store.stats import CommandCalls
from switchboard_bench.costs import Spread, SpreadMeter
from switchboard_bench.harness import STATE_CLUSTER, Stack
from switchboard_bench.report import write_readme
from switchboard_bench.shapes_report import QUICK, outcome, spread_text

pytestmark = pytest.mark.unit

A, B, C = "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"


def _spread() -> Spread:
    return Spread(
        by_node={
            A: Counter({"hset": 500, "zadd": 100}),
            B: Counter({"hset": 300}),
            C: Counter({"hset": 300}),
        },
        cpu_s={A: 2.0, B: 1.0, C: 1.0},
        groups={A: 21, B: 22, C: 21},
        polled=24,
    )


def test_spread_gives_each_primarys_share_and_the_busiest_over_the_mean() -> None:
    """Shares of commands, CPU and groups per primary; busiest over mean; the polls' share."""
    summary = _spread().summary(units=100)
    assert summary["commands"] == {A: 0.5, B: 0.25, C: 0.25}
    assert summary["redisCpu"] == {A: 0.5, B: 0.25, C: 0.25}
    assert summary["slotGroupsOwned"] == {A: 21, B: 22, C: 21}
    assert summary["commandsPerRun"] == {A: 6.0, B: 3.0, C: 3.0}
    assert summary["busiestOverMean"] == {"commands": 1.5, "redisCpu": 1.5, "slotGroups": 1.03}
    assert summary["benchPollsShare"] == 0.02


def test_spread_names_what_the_busiest_primary_ran_above_the_others() -> None:
    """The busiest primary's extra commands per run, by name, the largest first."""
    summary = _spread().summary(units=100)
    assert summary["busiestExtraPerRun"] == {"hset": 2.0, "zadd": 1.0}


def test_spread_without_measured_work_has_no_ratio() -> None:
    """Nothing measured: shares and ratios are None, not a division by zero."""
    summary = Spread(by_node={A: Counter(), B: Counter()}, cpu_s={A: 0.0, B: 0.0}).summary(0)
    assert summary["commands"] == {A: None, B: None}
    assert summary["busiestOverMean"]["commands"] is None
    assert summary["busiestExtraPerRun"] == {}


@dataclass
class _Node:
    address: str
    port: int
    pid: int = field(default_factory=os.getpid)


@dataclass
class _Cluster:
    nodes: list[_Node]
    primaries: int


class _FakeStack:
    """A stack whose cluster's primaries answer INFO commandstats from a script of readings."""

    def __init__(self, readings: list[dict[int, dict[str, int]]]) -> None:
        self.cluster = _Cluster([_Node(A, 7001), _Node(B, 7002), _Node(C, 7003)], primaries=2)
        self.readings = iter(readings)
        self.polled_commands: Counter[str] = Counter()

    def calls_by_server(self, names: list[str]) -> dict[int, CommandCalls]:
        assert names == [STATE_CLUSTER]
        return {port: CommandCalls(calls) for port, calls in next(self.readings).items()}


def test_spread_meter_counts_each_primarys_commands_between_its_readings() -> None:
    """Per primary (replicas left out): calls after less before, INFO not counted; polls apart."""
    before = {7001: {"hset": 10, "info": 1}, 7002: {"hset": 5}, 7003: {"hset": 0}}
    after = {7001: {"hset": 40, "info": 2}, 7002: {"hset": 25, "get": 3}, 7003: {"hset": 99}}
    fake = _FakeStack([before, after])
    meter = SpreadMeter(cast(Stack, fake), groups={A: 1, B: 1})
    spread = Spread()
    with meter.measure(spread):
        fake.polled_commands["hmget"] += 7
    assert spread.by_node == {A: Counter({"hset": 30}), B: Counter({"hset": 20, "get": 3})}
    assert set(spread.cpu_s) == {A, B}
    assert spread.polled == 7


def _cluster_row(apis: int, workers: int) -> dict[str, Any]:
    return {
        "broker": "redis",
        "store": "redis-cluster-3",
        "apis": apis,
        "workers": workers,
        "runsPerS": 300.0,
        "rounds": [300.0],
        "sendWait": {"p50_ms": 6.0},
        "anchor": {"tasksPerS": 800.0, "roundTrip": {"p50_ms": 2.0}},
        "runsPerSToAnchor": 0.375,
        "costs": {"redisCommands": 175.0},
        "cpuMsPerRun": {"api": 1.0, "worker": 2.5, "redis": 1.0},
        "sends": 100,
        "completed": 100,
        "sendWaitNotOk": 0,
        "stateSpread": _spread().summary(units=100),
        "brokerCosts": {"redisCommands": 12.5, "cpuSPer1000": 0.042},
    }


def test_summary_line_gives_the_split_shape_by_shape() -> None:
    """The scale line gives each cluster shape's command shares and busiest/mean."""
    text = spread_text([_cluster_row(1, 1), _cluster_row(2, 2)])
    assert text is not None
    assert "1x1 0.50/0.25/0.25 (1.5x), 2x2 0.50/0.25/0.25 (1.5x)" in text
    assert "slot groups 21/22/21: 1.03x" in text
    assert spread_text([{"store": "redis"}]) is None
    line = outcome([_cluster_row(1, 1)], QUICK).figure_text
    assert "the state's commands over redis-cluster-3's primaries" in line


def test_results_readme_has_a_row_per_cluster_shape_with_its_split(tmp_path: Path) -> None:
    """The per-primary table lists the groups owned, the shares, the ratios and the extras."""
    doc = {
        "scenario": "scale",
        "summary": "s",
        "anchorSummary": "a",
        "ratio": 1.0,
        "target": "t",
        "pass": True,
        "correct": True,
        "figure": {"shapes": [_cluster_row(2, 2)]},
    }
    (tmp_path / "scale.json").write_text(json.dumps(doc))
    text = write_readme(tmp_path).read_text()
    row = (
        "| redis-cluster-3 | 2x2 | 21 / 22 / 21 | 0.50 / 0.25 / 0.25 | 0.50 / 0.25 / 0.25 "
        "| 1.03, 1.50, 1.50 | hset 2, zadd 1 | 12.5 commands, 0.042 ms CPU |"
    )
    assert row in text
