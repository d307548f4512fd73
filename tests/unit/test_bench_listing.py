"""The listing scenario on stacks cut into several numbers of slot groups, side by side."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

import switchboard_bench as bench
from switchboard.cli import app
from switchboard.supervisor.redis_server import RedisServer
from switchboard_bench import run_bench, scale
from switchboard_bench.harness import BenchRun, Stack
from switchboard_bench.report import Outcome

pytestmark = pytest.mark.unit


def _stack(tmp_path: Path, slot_groups: int | None) -> Stack:
    data = {"SWITCHBOARD_DATA_DIR": str(tmp_path / "data")}
    return Stack(
        redis=RedisServer(tmp_path / "redis"),  # not started: nothing here connects
        api_url="http://127.0.0.1:1",
        workdir=tmp_path,
        env=data,
        slot_groups=slot_groups,
    )


def test_a_stack_cut_into_groups_reads_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench's settings and store take the stack's slot groups, never the caller's."""
    monkeypatch.setenv("SWITCHBOARD_SLOT_GROUPS", "8")
    cut = _stack(tmp_path, 64)
    assert cut.settings().groups == 64 and cut.store().ks.groups == 64
    plain = _stack(tmp_path, None)
    assert plain.settings().groups == 1 and plain.store().ks.groups == 1
    cut.close()
    plain.close()


def _variant(groups: int, ms: float, http_ms: float) -> Any:
    return scale._Variant(groups, 1000, 2.0, {"sessions": []}, [ms] * 5, [http_ms] * 5)


def test_each_stacks_p50s_are_given_with_their_ratio_to_the_first() -> None:
    """64 groups at 3 ms against 1 at 2 ms: 1.5x in-process; the HTTP ratio beside it."""
    rows = scale.by_slot_groups([_variant(1, 2.0, 4.0), _variant(64, 3.0, 5.0)])
    assert [r["slotGroups"] for r in rows] == [1, 64]
    assert rows[1]["p50_ms"] == 3.0 and rows[1]["p50ToFirst"] == 1.5
    assert rows[1]["httpP50ToFirst"] == 1.25
    text = scale.slot_groups_text(rows)
    assert text == "1 slot group; 64 slot groups: p50 3.00 ms, 1.50x (HTTP 5.0 ms, 1.25x)"


def test_run_bench_hands_the_slot_groups_to_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run_bench(slot_groups=…)` runs the listing with them, in the order given."""
    seen: list[Sequence[int]] = []

    def listing(run: BenchRun, slot_groups: Sequence[int] = ()) -> Outcome:
        seen.append(slot_groups)
        return Outcome("listing", "t", {}, {}, None, "t", True, "f", "a")

    monkeypatch.setattr(scale, "listing", listing)
    console = Console(file=io.StringIO())
    code = run_bench(
        ["listing"], quick=True, out_dir=tmp_path, console=console, slot_groups=[64, 1]
    )
    assert code == 0 and seen == [[64, 1]]


def test_bench_command_takes_repeated_slot_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """`switchboard bench --slot-groups 1 --slot-groups 64` passes both; 0 is refused."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(bench, "run_bench", lambda names, **kw: calls.append(kw) or 0)
    argv = [
        "bench",
        "-s",
        "listing",
        "--slot-groups",
        "1",
        "--slot-groups",
        "64",
    ]
    done = CliRunner().invoke(app, argv)
    assert done.exit_code == 0, done.output
    assert calls[0]["slot_groups"] == [1, 64]
    assert CliRunner().invoke(app, [*argv, "--slot-groups", "0"]).exit_code == 2
