"""`switchboard bench`: start a private stack, run scenarios, print a table, write JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from switchboard.bench import scenarios
from switchboard.bench.harness import stack

SCENARIOS = {"roundtrip": scenarios.roundtrip}


def run_bench(names: list[str], *, quick: bool, out_dir: Path, console: Console) -> int:
    """Run the named scenarios; write bench/results/<name>.json; print a table."""
    results: list[dict[str, Any]] = []
    with stack() as st, Progress(console=console, transient=True) as progress:
        for name in names:
            result = SCENARIOS[name](st, progress, n=50 if quick else 300)
            results.append(result)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = Table("scenario", "figure", "anchor", "ratio")
    for r in results:
        (out_dir / f"{r['scenario']}.json").write_text(json.dumps(r, indent=2) + "\n")
        table.add_row(
            r["scenario"],
            f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms",
            f"p50 {r['anchor_p50_ms']} ms",
            f"{r['ratio_p50']}x",
        )
    console.print(table)
    return 0
