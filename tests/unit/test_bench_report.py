"""The bench's results README tables and the environment of the processes it starts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from switchboard.shared.config import Settings
from switchboard_bench import EXIT_INCOMPLETE, EXIT_MISSED, exit_code, report
from switchboard_bench.costs import Costs
from switchboard_bench.harness import stack_env
from switchboard_bench.report import TABLE_END, TABLE_START, Outcome, write_readme

pytestmark = pytest.mark.unit


def _doc(scenario: str, **extra: Any) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "summary": f"{scenario} figure",
        "anchorSummary": f"{scenario} anchor",
        "ratio": 1.5,
        "target": "t",
        "pass": True,
        "correct": True,
        "quick": False,
        **extra,
    }


def test_readme_tables_list_figures_and_costs(tmp_path: Path) -> None:
    """Each scenario's JSON becomes a row, its costs a cost row."""
    costs = Costs()
    costs.commands.update({"evalsha": 20, "hset": 30})
    costs.cpu_s = 0.5
    cost = costs.summary(10, unit="completed fire-and-forget run")
    (tmp_path / "throughput.json").write_text(
        json.dumps(_doc("throughput", costs={"fireAndForget": cost}))
    )
    (tmp_path / "latency.json").write_text(json.dumps(_doc("latency")))
    text = write_readme(tmp_path).read_text()
    assert text.index("| latency |") < text.index("| throughput |")
    assert "| completed fire-and-forget run (fireAndForget) | 5.0 | 2.0 | 50.0 |" in text


def test_readme_tables_replace_only_their_own_block(tmp_path: Path) -> None:
    """Prose around the marked block survives a rewrite; the old tables do not."""
    (tmp_path / "README.md").write_text(
        f"Intro.\n\n{TABLE_START}\nold table\n{TABLE_END}\n\nAfterword.\n"
    )
    (tmp_path / "parked.json").write_text(json.dumps(_doc("parked", ratio=None)))
    text = write_readme(tmp_path).read_text()
    assert text.startswith("Intro.\n\n" + TABLE_START)
    assert "old table" not in text and "| parked |" in text
    assert text.rstrip().endswith("Afterword.")


def test_stack_processes_get_the_stacks_settings_not_the_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stack's env carries its own Redis, never the caller's settings."""
    parent = {"PATH": "/bin", "SWITCHBOARD_SLOT_GROUPS": "8", "SWITCHBOARD_REDIS_URL": "x"}
    env = stack_env(parent, "redis://127.0.0.1:1/0", tmp_path)
    assert env["PATH"] == "/bin"
    assert env["SWITCHBOARD_REDIS_URL"] == "redis://127.0.0.1:1/0"
    assert "SWITCHBOARD_SLOT_GROUPS" not in env
    for name in [k for k in os.environ if k.startswith("SWITCHBOARD_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("SWITCHBOARD_"):
            monkeypatch.setenv(name, value)
    assert Settings().redis_url == "redis://127.0.0.1:1/0"  # what the started processes read
    assert Settings().slot_groups != 8  # not the caller's


def _outcome(*, passed: bool, correct: bool = True) -> Outcome:
    return Outcome(
        scenario="latency",
        title="latency",
        figure={},
        anchor={},
        ratio=None,
        target="",
        passed=passed,
        figure_text="",
        anchor_text="",
        checks={"allCompleted": correct},
    )


@pytest.mark.parametrize(
    ("outcomes", "errors", "quick", "code"),
    [
        ([_outcome(passed=True)], {}, False, 0),
        ([_outcome(passed=False)], {}, False, EXIT_MISSED),
        ([_outcome(passed=False)], {}, True, 0),  # a quick run judges no speed
        ([_outcome(passed=True, correct=False)], {}, True, EXIT_INCOMPLETE),
        ([_outcome(passed=False, correct=False)], {}, False, EXIT_INCOMPLETE),
        ([_outcome(passed=True)], {"fanout": "could not start"}, False, EXIT_INCOMPLETE),
    ],
)
def test_exit_code_tells_an_incomplete_run_from_a_missed_target(
    outcomes: list[Outcome], errors: dict[str, str], quick: bool, code: int
) -> None:
    assert exit_code(outcomes, errors, quick=quick) == code


def test_the_host_speed_is_timeits_best_of_five_per_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """`machine.pythonLoopNs` reads as `python -m timeit "sum(range(50))"` does: the best
    of five repeats, per loop, in nanoseconds."""
    asked: list[tuple[str, int, int]] = []

    def repeat(stmt: str, *, number: int, repeat: int) -> list[float]:
        asked.append((stmt, number, repeat))
        return [0.052, 0.0451, 0.06, 0.047, 0.049]

    monkeypatch.setattr(report.timeit, "repeat", repeat)
    assert report.python_loop_ns() == 451.0
    assert asked == [("sum(range(50))", 100_000, 5)]
    assert report.machine_info()["pythonLoopNs"] == 451.0
    assert report.machine_info(loop_ns=612.5)["pythonLoopNs"] == 612.5  # taken before


def test_repeated_runs_keep_the_median_run_and_a_check_failed_in_any() -> None:
    """Of three runs the one with the median ratio is kept, every run's figure listed beside
    it; a check that failed in another run fails the kept one."""
    from switchboard_bench import _median_run

    done = []
    for i, (r, ok) in enumerate([(2.9, True), (2.1, False), (3.4, True)]):
        outcome = _outcome(passed=r <= 3, correct=ok)
        outcome.ratio = r
        doc = outcome.to_json(quick=False, machine={}, duration_s=1.0)
        doc["summary"] = f"run {i}"
        done.append((outcome, doc))
    kept, doc = _median_run(done)
    assert kept.ratio == 2.9 and doc["ratio"] == 2.9
    assert [run["ratio"] for run in doc["runs"]] == [2.9, 2.1, 3.4]
    assert doc["checks"] == {"allCompleted": False} and doc["correct"] is False
