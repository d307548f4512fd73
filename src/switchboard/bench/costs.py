"""What a unit of work costs: Redis commands (``INFO commandstats``) and CPU seconds.

A `CostMeter` reads the calls per command of the named Redis servers (summed: the stack's
Redis, and every node of the cluster when the state is on one) and the CPU time (user +
system, from /proc through psutil) of named process trees before and after some work; the
difference, less the commands the bench sent itself while polling for the end, is the
work's cost.
Divided by the runs completed, it sizes a Redis shard: commands per run and CPU seconds
per thousand runs across api, worker and Redis.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psutil

from switchboard.bench.harness import Stack

_TOP = 8  # commands listed by name in a summary; the rest are counted in the total
_SCRIPTS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


@dataclass
class Costs:
    """Redis commands (per command) and CPU seconds summed over measured work."""

    commands: Counter[str] = field(default_factory=Counter)
    cpu_s: float = 0.0

    def summary(self, units: int, *, unit: str) -> dict[str, Any]:
        """Per ``unit``: Redis commands (total and the busiest by name), script calls, and
        CPU seconds per 1,000. Redis counts the commands a Lua script runs as calls of their
        own, so the total is every command the server executed, not the round trips."""
        if units <= 0:
            return {"per": unit, "units": 0}
        total = sum(self.commands.values())
        top = {name: round(n / units, 2) for name, n in self.commands.most_common(_TOP)}
        return {
            "per": unit,
            "units": units,
            "redisCommands": round(total / units, 2),
            "redisCommandsByName": top,
            "scriptCalls": round(sum(self.commands[name] for name in _SCRIPTS) / units, 2),
            "cpuSPer1000": round(self.cpu_s / units * 1000, 3),
        }


class CostMeter:
    """Measures the cost of work done by the stack's named processes: CPU of them all,
    Redis commands of the Redis servers among them (``redis``, ``redis-cluster``:
    `Stack.redis_servers`)."""

    def __init__(self, st: Stack, processes: Sequence[str]) -> None:
        self.st = st
        self.processes = tuple(processes)

    @contextmanager
    def measure(self, into: Costs) -> Iterator[None]:
        """Add the commands and CPU spent inside the block to ``into``."""
        polled_before = Counter(self.st.polled_commands)
        cpu_before = self._cpu_s()
        calls_before = self.st.command_calls(self.processes)
        yield
        calls = self.st.command_calls(self.processes).since(calls_before)
        into.cpu_s += self._cpu_s() - cpu_before
        polled = self.st.polled_commands - polled_before
        into.commands.update(Counter(calls) - polled)  # drops what falls to zero or below

    def _cpu_s(self) -> float:
        total = 0.0
        for proc in self.st.process_tree(self.processes):
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:  # a child that ended since the tree was read
                continue
            total += times.user + times.system
        return total
