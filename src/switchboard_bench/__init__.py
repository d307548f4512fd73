"""`switchboard bench`: run scenarios on private stacks, print a table, write JSON figures.

Each scenario starts its own private Redis and product processes, measures its figure and
its anchor side by side in the same run (the machine may be noisy; ratios hold), and
returns an `Outcome`, written to ``<out>/<scenario>.json``; ``<out>/README.md`` gets the
tables of every JSON file there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from switchboard.shared.errors import SwitchboardError
from switchboard_bench import batches, fanout, messaging, parked, scale, search, shapes, tools
from switchboard_bench.harness import BenchRun, Stacks
from switchboard_bench.report import Outcome, machine_info, python_loop_ns, write_readme

SCENARIOS: dict[str, Callable[[BenchRun], Outcome]] = {
    # In an order that lets consecutive scenarios share their processes.
    "latency": messaging.latency,
    "throughput": messaging.throughput,
    "listing": scale.listing,
    "history": scale.history,
    "fanout": fanout.fanout,
    "parked": parked.parked,
    "tools": tools.tools,
    "scale": shapes.scale,
    "batch": batches.batch,
    "search": search.search,
}
# Run only when named (``-s scale``): six stacks of up to four product processes each, and a
# RabbitMQ vhost; the default run (every other scenario) stays as long as it was.
ON_REQUEST = frozenset({"scale", "batch", "search"})
# Exit codes: a scenario could not run or a check failed; or every figure is sound but a
# full run missed a speed target (`make bench` tells them apart).
EXIT_INCOMPLETE = 1
EXIT_MISSED = 4


def run_bench(
    names: list[str],
    *,
    quick: bool,
    out_dir: Path,
    console: Console,
    subagents: Sequence[int] | None = None,
    slot_groups: Sequence[int] | None = None,
    repeat: int = 1,
) -> int:
    """Run the named scenarios; write ``<out_dir>/<name>.json`` and its README; print a table.

    Exit code (`exit_code`): 1 when a scenario could not run or a correctness check failed
    (anything incomplete, any timeout); else, in a full run, 4 when a speed target was
    missed (the figures are sound, only slower than the target). A quick
    run (scaled-down counts, a smoke test) judges nothing about speed. ``subagents``: the
    fan-out's sizes (default `fanout.SIZES`; quick `fanout.QUICK_SIZES`). ``slot_groups``:
    the listing's stacks' slot groups, each value on a stack of its own side by side
    (default: one stack, the setting's default). ``repeat``: every scenario runs that many
    times (all of them, then all again); each JSON holds the median run by its ratio, with
    every run's figure beside it, and a check that failed in any run fails it.
    """
    names = [name for name in SCENARIOS if name in names]  # the order that shares stacks
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[tuple[Outcome, dict[str, Any]]]] = {name: [] for name in names}
    errors: dict[str, str] = {}
    mode = ("quick" if quick else "full") + (f", {repeat} runs, medians" if repeat > 1 else "")
    console.print(f"[bold]switchboard bench[/] ({mode}): {', '.join(names)}")
    loop_ns = python_loop_ns()  # the host's speed, before the bench's processes load it
    with _progress(console) as progress, Stacks(progress) as stacks:
        run = BenchRun(progress=progress, quick=quick, stacks=stacks)
        for round_no in range(repeat):
            for name in names:
                if name in errors:
                    continue
                t0 = time.monotonic()
                try:
                    outcome = _scenario(run, name, subagents, slot_groups)
                except (SwitchboardError, OSError, TimeoutError, httpx.HTTPError) as exc:
                    message = exc.message if isinstance(exc, SwitchboardError) else str(exc)
                    if isinstance(exc, SwitchboardError) and exc.fields.get("detail"):
                        message += f" ({exc.fields['detail']})"  # what Redis or the broker said
                    errors[name] = message
                    progress.console.print(_failed_line(name, message))
                    logs = stacks.close(keep_logs=True)  # the next one starts afresh
                    if logs is not None:
                        progress.console.print(f"process logs kept in {logs}", markup=False)
                    continue
                took = time.monotonic() - t0
                doc = outcome.to_json(
                    quick=quick, machine=machine_info(loop_ns=loop_ns), duration_s=took
                )
                runs[name].append((outcome, doc))
                median = _median_run(runs[name])[1]  # written as it comes: a crash keeps it
                (out_dir / f"{name}.json").write_text(json.dumps(median, indent=2) + "\n")
                verdict = "[green]pass[/]" if outcome.passed else "[yellow]miss[/]"
                shown = f"{name}" + (f" (run {round_no + 1}/{repeat})" if repeat > 1 else "")
                progress.console.print(
                    f"{shown}: {outcome.figure_text} (anchor {outcome.anchor_text}) {verdict}"
                    f" in {took:.0f}s"
                )
    outcomes = []
    for name, done in runs.items():
        if name in errors or not done:
            continue
        outcomes.append(_median_run(done)[0])
    # Logs and CI read the table from a pipe: there, do not wrap it at 80 columns.
    wide = console if console.is_terminal else Console(file=console.file, width=160)
    wide.print(_table(outcomes, errors, quick=quick))
    if outcomes:
        readme = write_readme(out_dir)
        console.print(f"JSON figures in {out_dir}/, their tables in {readme}")
    return exit_code(outcomes, errors, quick=quick)


def _scenario(
    run: BenchRun,
    name: str,
    subagents: Sequence[int] | None,
    slot_groups: Sequence[int] | None,
) -> Outcome:
    if name == "fanout" and subagents:
        return fanout.fanout(run, sizes=subagents)
    if name == "listing" and slot_groups:
        return scale.listing(run, slot_groups=slot_groups)
    return SCENARIOS[name](run)


def _median_run(
    done: Sequence[tuple[Outcome, dict[str, Any]]],
) -> tuple[Outcome, dict[str, Any]]:
    """Of a scenario's runs, the median by ratio (the middle one when a run has none), its
    JSON given every run's figure; a check that failed in any run fails the median's."""
    ratios = [d[0].ratio for d in done]
    ordered = list(done)
    if all(r is not None for r in ratios):
        ordered.sort(key=lambda d: d[0].ratio or 0.0)
    outcome, doc = ordered[(len(ordered) - 1) // 2]
    if len(done) > 1:
        for other, _ in done:
            for check, held in other.checks.items():
                outcome.checks[check] = outcome.checks.get(check, True) and held
        doc["checks"], doc["correct"] = outcome.checks, outcome.correct
        doc["runs"] = [
            {"summary": d["summary"], "ratio": d["ratio"], "pass": d["pass"], "at": d["measuredAt"]}
            for _, d in done
        ]
        doc["median"] = "the run with the median ratio of the runs listed in `runs`"
    return outcome, doc


def exit_code(outcomes: Sequence[Outcome], errors: Mapping[str, str], *, quick: bool) -> int:
    """`EXIT_INCOMPLETE` when a scenario could not run or a correctness check failed,
    else `EXIT_MISSED` when a full run missed a speed target, else 0."""
    if errors or not all(o.correct for o in outcomes):
        return EXIT_INCOMPLETE
    if not quick and not all(o.passed for o in outcomes):
        return EXIT_MISSED
    return 0


def _progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _table(outcomes: list[Outcome], errors: dict[str, str], *, quick: bool) -> Table:
    title = "switchboard bench" + (
        " (quick: scaled-down counts, speed not judged)" if quick else ""
    )
    table = Table("scenario", "figure", "anchor", "ratio", "target", "result", title=title)
    for o in outcomes:
        if not o.correct:
            result = "[red]INCORRECT[/]: " + ", ".join(k for k, v in o.checks.items() if not v)
        elif o.passed:
            result = "[green]pass[/]"
        else:
            result = "[yellow]miss[/]" if quick else "[red]FAIL[/]"
        shown_ratio = (
            "" if o.ratio is None else f"{o.ratio:,.3g}x" if o.ratio < 100 else f"{o.ratio:,.0f}x"
        )
        table.add_row(o.scenario, o.figure_text, o.anchor_text, shown_ratio, o.target, result)
    for name, message in errors.items():
        table.add_row(name, "", "", "", "", f"[red]ERROR[/]: {escape(message[:80])}")
    return table


def _failed_line(name: str, message: str) -> str:
    """A scenario's failure as rich markup, its message verbatim (brackets and all)."""
    return f"[red]{escape(name)} failed:[/] {escape(message)}"
