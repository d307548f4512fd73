"""What a scenario reports: its figure, its anchor, the ratio, the target and the verdict.

Every scenario returns one `Outcome`; `run_bench` writes it as `<scenario>.json` (with the
machine it was measured on) and as one row of the final table, and
`write_readme` turns the JSON files of an output directory into its README's tables.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
import timeit
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from switchboard import __version__
from switchboard_bench.command_steps import steps_markdown


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
    # What a unit of work cost (Redis commands, CPU), keyed by what was measured.
    costs: dict[str, Any] = field(default_factory=dict)
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
            "costs": self.costs,
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


def machine_info(redis_version: str | None = None, loop_ns: float | None = None) -> dict[str, Any]:
    """What the figures were measured on; the machine may be shared, hence the load.
    ``loop_ns``: the host's speed (`python_loop_ns`) as measured before the bench started
    its processes (measured now when not given)."""
    memory = psutil.virtual_memory()
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpuCount": os.cpu_count(),
        "memoryGiB": round(memory.total / 2**30, 1),
        "loadAverage": [round(x, 2) for x in os.getloadavg()],
        "pythonLoopNs": python_loop_ns() if loop_ns is None else loop_ns,
        "redis": redis_version,
        "switchboard": __version__,
        "commit": _git_commit(),
    }


# What `python_loop_ns` times: `python -m timeit "sum(range(50))"`, the best of five.
_LOOP_STMT = "sum(range(50))"
_LOOP_NUMBER = 100_000


def python_loop_ns() -> float:
    """The host's speed at plain Python, as ``python -m timeit "sum(range(50))"`` reports
    it (ns per loop, the best of five): figures that are CPU time move with it between
    hosts, where the load average says nothing of a slower core."""
    best = min(timeit.repeat(_LOOP_STMT, number=_LOOP_NUMBER, repeat=5))
    return round(best / _LOOP_NUMBER * 1e9, 1)


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


# -- the results README -------------------------------------------------------------------

TABLE_START = "<!-- bench:tables (written by switchboard bench) -->"
TABLE_END = "<!-- /bench:tables -->"
_ORDER = ("latency", "throughput", "listing", "history", "search", "fanout", "parked", "scale")


def write_readme(out_dir: Path) -> Path:
    """Write the tables of every ``<out_dir>/*.json`` into ``<out_dir>/README.md``.

    Only the part between the table markers is replaced: prose written around it stays.
    A README without the markers gets them (and the tables) added at its end."""
    docs = [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]
    docs.sort(key=lambda d: _ORDER.index(d["scenario"]) if d["scenario"] in _ORDER else 99)
    block = f"{TABLE_START}\n{results_markdown(docs)}{TABLE_END}\n"
    path = out_dir / "README.md"
    text = path.read_text() if path.exists() else ""
    if TABLE_START in text and TABLE_END in text:
        head, rest = text.split(TABLE_START, 1)
        text = head + block + rest.split(TABLE_END, 1)[1].lstrip("\n")
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + block
    path.write_text(text)
    return path


def results_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """The figures table and the per-run cost table, in markdown."""
    quick = any(d.get("quick") for d in docs)
    lines = [
        *(["Quick run: speed not judged.", ""] if quick else []),
        "| scenario | figure | anchor, same run | ratio | target | |",
        "|---|---|---|---|---|---|",
    ]
    for d in docs:
        verdict = "pass" if d["pass"] else "miss" if d["correct"] else "INCORRECT"
        lines.append(
            f"| {d['scenario']} | {d['summary']} | {d['anchorSummary']} "
            f"| {_ratio_cell(d['ratio'])} | {d['target']} | {verdict} |"
        )
    lines += _drain_lines(docs)
    lines += _shape_lines(docs)
    costs = [(d["scenario"], name, c) for d in docs for name, c in d.get("costs", {}).items()]
    if costs:
        lines += [
            "",
            "| per | Redis commands | of them Lua script calls | CPU s per 1,000 "
            "| busiest commands | measured in |",
            "|---|---|---|---|---|---|",
        ]
        for scenario, name, c in costs:
            top = ", ".join(
                f"{k} {v:g}" for k, v in list(c.get("redisCommandsByName", {}).items())[:4]
            )
            lines.append(
                f"| {c.get('per', name)} ({name}) | {c.get('redisCommands', '—')} "
                f"| {c.get('scriptCalls', '—')} | {c.get('cpuSPer1000', '—')} | {top} "
                f"| {scenario} |"
            )
    lines += steps_markdown(docs)
    if costs:
        lines += [
            "",
            "Redis commands are every command the server executed (`INFO commandstats`, "
            "those a Lua script runs included), less the bench's own polling; CPU is user + "
            "system time of the processes named in each scenario's parameters.",
        ]
    return "\n".join(lines) + "\n"


def _drain_lines(docs: Sequence[dict[str, Any]]) -> list[str]:
    """The fan-out's agents_wait drain (collector children), beside its announce figure."""
    out = []
    for d in docs:
        drain = d.get("figure", {}).get("agentsWaitDrain")
        if not drain:
            continue
        first = drain.get("firstCompletionS")
        out += [
            "",
            f"{d['scenario']}, agents_wait drain: {drain['collected']}/{drain['collectors']} "
            f"collector children collected, the last {drain['lastCompletionS']} s after the "
            f"spawn call (first {'—' if first is None else first} s; spawn call "
            f"{drain['spawnCallS']} s; {drain['agentsWaitCalls']} agents_wait calls).",
        ]
    return out


def _shape_lines(docs: Sequence[dict[str, Any]]) -> list[str]:
    """The scale scenario's shapes, one row each, its anchor on the same broker beside."""
    out = []
    for d in docs:
        shapes = d.get("figure", {}).get("shapes")
        if not shapes:
            continue
        out += [
            "",
            f"{d['scenario']}, by shape (apis x workers):",
            "",
            "| broker | state | apis x workers | runs/s | send+wait p50 | anchor tasks/s "
            "| anchor p50 | runs/s / anchor | Redis commands per run "
            "| CPU ms per run: api / worker / redis |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in shapes:
            if "skipped" in r:
                out.append(f"| {r['broker']} | {r['store']} | — | {r['skipped']} |||||||")
                continue
            a, c = r["anchor"], r["costs"]
            ms = r.get("cpuMsPerRun", {})
            cpu = " / ".join(f"{ms.get(role) or 0:.2f}" for role in ("api", "worker", "redis"))
            out.append(
                f"| {r['broker']} | {r['store']} | {r['apis']}x{r['workers']} "
                f"| {r['runsPerS']:,.0f} | {r['sendWait']['p50_ms']:.1f} ms "
                f"| {a['tasksPerS']:,.0f} | {a['roundTrip']['p50_ms']:.1f} ms "
                f"| {_ratio_cell(r['runsPerSToAnchor'])} | {c.get('redisCommands', '—')} "
                f"| {cpu} |"
            )
        counted = {r["store"]: r["redisCounted"] for r in shapes if "redisCounted" in r}
        if counted:
            out.append("")
            out += [
                f"Redis commands and CPU, state on {store}: {what}."
                for store, what in counted.items()
            ]
        out += _spread_lines(d["scenario"], shapes)
    return out


def _spread_lines(scenario: str, shapes: Sequence[dict[str, Any]]) -> list[str]:
    """The rows with the state on a cluster: each primary's share of the state's slot
    groups, commands and Redis CPU, and the busiest one's over the mean."""
    split = [r for r in shapes if r.get("stateSpread")]
    if not split:
        return []
    out = [
        "",
        f"{scenario}, the state's load by primary (throughput rounds; primaries in slot order):",
        "",
        "| state | apis x workers | slot groups owned | share of the commands "
        "| share of the Redis CPU | busiest / mean: groups, commands, CPU "
        "| the busiest's extra commands per run | the broker's Redis per run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in split:
        spread = r["stateSpread"]
        owned = " / ".join(str(n) for n in spread.get("slotGroupsOwned", {}).values())
        busiest = spread.get("busiestOverMean", {})
        ratios = ", ".join(
            _share(busiest.get(what)) for what in ("slotGroups", "commands", "redisCpu")
        )
        extra = spread.get("busiestExtraPerRun", {})
        extras = ", ".join(f"{name} {n:g}" for name, n in list(extra.items())[:4]) or "—"
        broker = r.get("brokerCosts", {})
        on_broker = (
            f"{broker['redisCommands']:g} commands, {broker['cpuSPer1000']:.3f} ms CPU"
            if "redisCommands" in broker
            else "—"
        )
        out.append(
            f"| {r['store']} | {r['apis']}x{r['workers']} | {owned} "
            f"| {_shares(spread.get('commands', {}))} | {_shares(spread.get('redisCpu', {}))} "
            f"| {ratios} | {extras} | {on_broker} |"
        )
    return out


def _shares(shares: dict[str, float | None]) -> str:
    return " / ".join(_share(v) for v in shares.values()) or "—"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _ratio_cell(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.3g}" if value < 100 else f"{value:,.0f}"
