"""The sizing model's arithmetic and the scale scenario's per-role CPU and results table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from switchboard_bench.report import write_readme
from switchboard_bench.shapes import cpu_ms_per_run
from switchboard_bench.sizing import (
    busiest_over_mean,
    capacity,
    groups_by_slot_range,
    groups_dealt_evenly,
    shard_runs_per_s,
    workers_for,
)

pytestmark = pytest.mark.unit


def test_a_shard_serves_its_headroom_of_the_ceiling_divided_by_commands_per_run() -> None:
    """200,000 commands/s at half load, 100 commands a run: 1,000 runs/s."""
    assert shard_runs_per_s(200_000, 100, headroom=0.5) == pytest.approx(1000)
    assert shard_runs_per_s(200_000, 100, headroom=1.0) == pytest.approx(2000)
    with pytest.raises(ValueError):
        shard_runs_per_s(200_000, 0)
    with pytest.raises(ValueError):
        shard_runs_per_s(200_000, 100, headroom=0)


def test_capacity_is_the_smaller_side_and_names_it() -> None:
    """Workers add linearly, shards add by their balance; the smaller side is the limit."""
    few_workers = capacity(
        workers=10, runs_per_s_per_worker=50, shards=10, ceiling_ops_per_s=200_000, ops_per_run=100
    )
    assert few_workers.worker_runs_per_s == pytest.approx(500)
    assert few_workers.shard_runs_per_s == pytest.approx(10_000)
    assert few_workers.runs_per_s == pytest.approx(500)
    assert few_workers.bound_by == "workers"
    one_shard = capacity(
        workers=100,
        runs_per_s_per_worker=50,
        shards=1,
        ceiling_ops_per_s=200_000,
        ops_per_run=100,
        shard_balance=0.8,
    )
    assert one_shard.shard_runs_per_s == pytest.approx(800)
    assert one_shard.runs_per_s == pytest.approx(800)
    assert one_shard.bound_by == "redis"
    with pytest.raises(ValueError):
        capacity(workers=1, runs_per_s_per_worker=1, shards=0, ceiling_ops_per_s=1, ops_per_run=1)


def test_workers_for_rounds_up() -> None:
    """A fraction of a worker's rate needs a whole worker more."""
    assert workers_for(1000, 100) == 10
    assert workers_for(1001, 100) == 11
    assert workers_for(1, 100) == 1


def test_cpu_per_run_sums_each_role_over_its_processes() -> None:
    """api and api1 add up as the api role; per run in milliseconds; none without runs."""
    cpu = {"api": 1.0, "api1": 0.5, "worker0": 2.0, "worker1": 2.0, "redis": 0.25}
    assert cpu_ms_per_run(cpu, 500) == {"api": 3.0, "worker": 8.0, "redis": 0.5}
    assert cpu_ms_per_run(cpu, 0) == {"api": None, "worker": None, "redis": None}


def test_results_readme_lists_every_shape_and_the_cluster_row(tmp_path: Path) -> None:
    """A measured shape is a row with its anchor beside; a skipped one says why."""
    measured = {
        "broker": "redis",
        "store": "redis",
        "apis": 2,
        "workers": 2,
        "runsPerS": 321.0,
        "sendWait": {"p50_ms": 6.25},
        "anchor": {"tasksPerS": 640.0, "roundTrip": {"p50_ms": 2.0}},
        "runsPerSToAnchor": 0.502,
        "costs": {"redisCommands": 174.5},
        "cpuMsPerRun": {"api": 1.5, "worker": 3.25, "redis": 0.75},
    }
    doc = {
        "scenario": "scale",
        "summary": "s",
        "anchorSummary": "a",
        "ratio": 1.1,
        "target": "t",
        "pass": True,
        "correct": True,
        "figure": {
            "shapes": [
                measured,
                {"broker": "rabbitmq", "store": "redis", "skipped": "rabbitmqctl not found"},
                {"broker": "redis", "store": "redis-cluster-3", "skipped": "no cluster here"},
            ]
        },
    }
    (tmp_path / "scale.json").write_text(json.dumps(doc))
    text = write_readme(tmp_path).read_text()
    row = (
        "| redis | redis | 2x2 | 321 | 6.2 ms | 640 | 2.0 ms | 0.502 | 174.5 | 1.50 / 3.25 / 0.75 |"
    )
    assert row in text
    assert "| rabbitmq | redis | — | rabbitmqctl not found |" in text
    assert "| redis | redis-cluster-3 | — | no cluster here |" in text


def test_groups_dealt_evenly_differ_by_at_most_one() -> None:
    """64 groups over 10 shards: four of 7 and six of 6, the busiest 1.09x the mean."""
    dealt = groups_dealt_evenly(64, 10)
    assert sorted(dealt) == [6] * 6 + [7] * 4
    assert busiest_over_mean(dealt) == pytest.approx(7 / 6.4)
    assert groups_dealt_evenly(64, 3) == [22, 21, 21]


def test_groups_by_slot_range_follow_the_hash_tags_slots() -> None:
    """Each group lands on the range owning its tag's slot; the tags are chosen so that
    equal slot ranges hold whole groups as evenly as they can."""
    placed = groups_by_slot_range(64, 10)
    assert sum(placed) == 64 and len(placed) == 10
    assert sorted(placed) == [6, 6, 6, 6, 6, 6, 7, 7, 7, 7]
    assert busiest_over_mean(placed) == pytest.approx(7 / 6.4)
    assert groups_by_slot_range(64, 3) == [21, 21, 22]
    assert groups_by_slot_range(64, 16) == [4] * 16
    assert groups_by_slot_range(64, 32) == [2] * 32


def test_busiest_over_mean_refuses_no_load() -> None:
    """An even load is 1.0; one shard with all of it is the shard count; none is an error."""
    assert busiest_over_mean([5, 5, 5]) == pytest.approx(1.0)
    assert busiest_over_mean([9, 0, 0]) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        busiest_over_mean([0, 0])
