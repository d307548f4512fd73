"""The `bench` command: the product against its anchors, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from switchboard.cli.common import (
    EXIT_USAGE,
    _fail,
    app,
    console,
)

if TYPE_CHECKING:
    pass


@app.command()
def bench(
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            "--scenario",
            "-s",
            help="Scenario to run, repeatable (default all but scale, batch and search): latency, "
            "throughput, listing, history, fanout, parked, tools (sub-agents calling a capped MCP "
            "server), scale (apis x workers on Redis, RabbitMQ, and with the state on a Redis "
            "Cluster), batch (a 10,000-line batch), search (sessions_search over 100,000 "
            "sessions x 20 messages).",
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(help="Scaled-down counts, a smoke test that judges no speed (< 2 min)."),
    ] = False,
    out: Annotated[Path, typer.Option(help="Where the JSON figures go.")] = Path("bench/results"),
    subagents: Annotated[
        list[int] | None,
        typer.Option(
            "--subagents",
            help="Fan-out sizes, repeatable (default 1,000 and 10,000; --quick: 100), "
            "measured one after the other on the same stack.",
            min=1,
            max=10_000,
        ),
    ] = None,
    slot_groups: Annotated[
        list[int] | None,
        typer.Option(
            "--slot-groups",
            help="The listing scenario's SWITCHBOARD_SLOT_GROUPS, repeatable (default: the "
            "setting's default, 1 on one Redis): each value gets a stack of its own, loaded "
            "alike and measured side by side (samples interleaved); the first is judged.",
            min=1,
            max=1024,
        ),
    ] = None,
    repeat: Annotated[
        int,
        typer.Option(
            help="Run every scenario this many times (all, then all again); each JSON holds "
            "the median run by its ratio, with every run's figure.",
            min=1,
            max=9,
        ),
    ] = 1,
) -> None:
    """Benchmark the product against its anchors, side by side in one run."""
    from switchboard_bench import ON_REQUEST, SCENARIOS, run_bench

    names = scenario or [name for name in SCENARIOS if name not in ON_REQUEST]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        known = ", ".join(SCENARIOS)
        _fail("unknown scenario(s)", f"{', '.join(unknown)}; known: {known}", EXIT_USAGE)
    raise typer.Exit(
        run_bench(
            names,
            quick=quick,
            out_dir=out,
            console=console,
            subagents=subagents or None,
            slot_groups=slot_groups or None,
            repeat=repeat,
        )
    )
