"""What a unit of work costs: Redis commands (``INFO commandstats``) and CPU seconds.

A `CostMeter` reads the calls per command of the named Redis servers (summed: the stack's
Redis, and every node of the cluster when the state is on one) and the CPU time (user +
system, from /proc through psutil) of named process trees before and after some work; the
difference, less the commands the bench sent itself while polling for the end, is the
work's cost.
Divided by the runs completed, it sizes a Redis shard: commands per run and CPU seconds
per thousand runs across api, worker and Redis.

A `SpreadMeter` reads the same, node by node, of a Redis Cluster's primaries: how the
state's load was split over them (`Spread`), each primary's share of the commands and of
the Redis CPU, and the busiest primary's share over the mean (what the sizing model's
balance is made of).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psutil

from switchboard.shared.errors import Unavailable
from switchboard_bench.harness import STATE_CLUSTER, Stack
from switchboard_bench.sizing import busiest_over_mean

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
        return cpu_s(self.st.process_tree(self.processes))


def cpu_s(procs: Sequence[psutil.Process]) -> float:
    """User + system CPU seconds of ``procs`` (a child that ended since it was listed: 0)."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


@dataclass
class Spread:
    """Redis commands (by name) and CPU seconds of each primary (by address) summed over
    measured work, the slot groups each owns, and the commands the bench itself sent."""

    by_node: dict[str, Counter[str]] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    polled: int = 0

    @property
    def commands(self) -> dict[str, int]:
        """Commands per primary."""
        return {node: sum(calls.values()) for node, calls in self.by_node.items()}

    def summary(self, units: int) -> dict[str, Any]:
        """Each primary's share of the commands, of the Redis CPU and of the slot groups,
        and, for each, the busiest primary's share over the mean (1.0: an even split);
        what the busiest primary ran per ``unit`` above the others' mean, by command; the
        bench's own polls (on the state and on the broker) over the state's commands: at
        most their part in the split."""
        amounts: dict[str, Mapping[str, float]] = {
            "commands": self.commands,
            "redisCpu": self.cpu_s,
            "slotGroups": self.groups,
        }
        total = sum(self.commands.values())
        return {
            **{what: shares_of(a) for what, a in amounts.items()},
            "slotGroupsOwned": dict(self.groups),
            "commandsPerRun": {
                node: round(n / units, 2) if units > 0 else None
                for node, n in self.commands.items()
            },
            "busiestOverMean": {what: _busiest_ratio(a) for what, a in amounts.items()},
            "busiestExtraPerRun": busiest_extra(self.by_node, units),
            "benchPollsShare": round(self.polled / total, 3) if total > 0 else None,
        }


def shares_of(amounts: Mapping[str, float]) -> dict[str, float | None]:
    """Each key's share of the total (2 decimals); None each when the total is 0."""
    total = sum(amounts.values())
    return {k: round(v / total, 2) if total > 0 else None for k, v in amounts.items()}


def busiest_extra(by_node: Mapping[str, Counter[str]], units: int) -> dict[str, float]:
    """The commands the busiest node ran above the mean of the others, per unit, by name
    (the largest first, at most `_TOP`): what makes it the busiest."""
    if units <= 0 or len(by_node) < 2:
        return {}
    busiest = max(by_node, key=lambda node: sum(by_node[node].values()))
    others = [calls for node, calls in by_node.items() if node != busiest]
    extra = {
        name: (calls - sum(o[name] for o in others) / len(others)) / units
        for name, calls in by_node[busiest].items()
    }
    top = sorted(extra.items(), key=lambda item: -item[1])[:_TOP]
    return {name: round(n, 2) for name, n in top if n > 0}


def _busiest_ratio(amounts: Mapping[str, float]) -> float | None:
    """`sizing.busiest_over_mean` of the amounts (2 decimals); None when none was measured."""
    if not amounts or sum(amounts.values()) <= 0:
        return None
    return round(busiest_over_mean(list(amounts.values())), 2)


class SpreadMeter:
    """Measures how the work a block does on the stack's state cluster is split over its
    primaries: ``INFO commandstats`` of each before and after, and each one's CPU. The
    bench's own polls (run ends, the backlog: keys of every group) are in each count,
    spread as the state is; `Spread.polled` says how many they were."""

    def __init__(self, st: Stack, groups: Mapping[str, int] | None = None) -> None:
        self.st = st
        # The slot groups each primary owns (default: asked of the running cluster).
        self.groups = dict(groups) if groups is not None else groups_owned(st)

    @contextmanager
    def measure(self, into: Spread) -> Iterator[None]:
        """Add each primary's commands and CPU spent inside the block to ``into``."""
        nodes = self._primaries()
        polled_before = sum(self.st.polled_commands.values())
        cpu_before = {address: cpu_s([proc]) for address, proc in nodes.items()}
        calls_before = self.st.calls_by_server([STATE_CLUSTER])
        yield
        calls_after = self.st.calls_by_server([STATE_CLUSTER])
        for address, proc in nodes.items():
            port = int(address.rsplit(":", 1)[1])
            calls = into.by_node.setdefault(address, Counter())
            calls.update(calls_after[port].since(calls_before[port]))
            spent = cpu_s([proc]) - cpu_before[address]
            into.cpu_s[address] = into.cpu_s.get(address, 0.0) + spent
        into.groups = dict(self.groups)
        into.polled += sum(self.st.polled_commands.values()) - polled_before

    def _primaries(self) -> dict[str, psutil.Process]:
        cluster = self.st.cluster
        if cluster is None:
            raise ValueError("the stack's state is not on a cluster")
        out = {}
        for node in cluster.nodes[: cluster.primaries]:
            if node.pid is None:
                raise Unavailable(f"bench: cluster node {node.address} is not running")
            out[node.address] = psutil.Process(node.pid)
        return out


def groups_owned(st: Stack) -> dict[str, int]:
    """How many of the store's slot groups each primary of the stack's state cluster owns
    (by address, in slot order), as the running cluster places their hash tags."""
    cluster = st.cluster
    if cluster is None:
        raise ValueError("the stack's state is not on a cluster")
    owned = dict.fromkeys((node.address for node in cluster.nodes[: cluster.primaries]), 0)
    for group in st.store().ks.every_group():
        owner = cluster.primary_for(group.updated_all).address
        owned[owner] = owned.get(owner, 0) + 1
    return owned
