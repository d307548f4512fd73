"""Calls through `FleetLimitedToolset` for the tool-limit tests, in this process or as a
caller process of its own (``python toolcalls.py URL CALLS LIMIT SLEEP_S``).

The wrapped tool is a pydantic-ai `FunctionToolset` whose ``slow`` tool measures how many
of its calls are in flight at once, wherever they run: each call counts itself in on a
probe key of the test's Redis (INCR), notes the count it saw, sleeps and counts itself out.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import redis
from pydantic_ai import RunContext
from pydantic_ai.messages import ToolReturn
from pydantic_ai.models.test import TestModel
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import RunUsage

from switchboard import telemetry
from switchboard.shared.metrics import ToolMetrics
from switchboard.shared.runtime.tool_limits import ERROR_KEY, FleetLimitedToolset
from switchboard.shared.store import Store

SERVER = "slowsrv"
IN_FLIGHT = "probe:inflight"
SEEN = "probe:seen"
READY = "probe:ready"
# The slot groups of every store here: keys carry hash tags, and each script one slot.
GROUPS = 4


def open_store(url: str) -> Store:
    """The store the callers use, its scripts checked to name keys of one slot."""
    return Store.from_url(url, slot_check=True, groups=GROUPS)


def probe_toolset(url: str, sleep_s: float) -> FunctionToolset[None]:
    """A toolset whose ``slow`` tool notes the calls in flight with it, and ``boom`` fails."""
    probe = redis.Redis.from_url(url)
    toolset: FunctionToolset[None] = FunctionToolset()

    @toolset.tool_plain
    async def slow(label: str = "") -> str:
        """Sleep a while, counted in flight on the probe key."""
        seen = probe.incr(IN_FLIGHT)
        probe.rpush(SEEN, seen)
        try:
            await asyncio.sleep(sleep_s)
        finally:
            probe.decr(IN_FLIGHT)
        return f"done {label}"

    @toolset.tool_plain
    async def boom() -> str:
        """Fail as a tool server's error result does."""
        raise RuntimeError("the server answered an error")

    return toolset


def limited(
    store: Store,
    url: str,
    limit: int | None,
    sleep_s: float,
    *,
    metrics: ToolMetrics | None = None,
    **options: Any,
) -> FleetLimitedToolset[None]:
    """The probe toolset, wrapped as the server ``slowsrv`` at ``limit`` slots."""
    return FleetLimitedToolset(
        probe_toolset(url, sleep_s),
        server=SERVER,
        max_concurrent=limit,
        slots=store.tool_slots,
        metrics=metrics,
        **options,
    )


async def call(toolset: FleetLimitedToolset[None], name: str, **args: Any) -> Any:
    """One call of ``name`` through ``toolset``, as the agent loop makes it: its result, or
    the tool error the model reads (with its kind as ``kind``)."""
    ctx: RunContext[None] = RunContext(
        deps=None, model=TestModel(), usage=RunUsage(), tool_call_id=f"call-{time.time_ns()}"
    )
    tools = await toolset.get_tools(ctx)
    answer = await toolset.call_tool(name, args, ctx, tools[name])
    if isinstance(answer, ToolReturn):
        return {**answer.return_value, "kind": (answer.metadata or {})[ERROR_KEY]}
    return answer


async def _main(url: str, calls: int, limit: int, sleep_s: float, parties: int) -> list[Any]:
    store = open_store(url)
    toolset = limited(store, url, limit, sleep_s)
    probe = redis.Redis.from_url(url)
    probe.incr(READY)
    while int(probe.get(READY) or 0) < parties:  # every caller process starts together
        await asyncio.sleep(0.01)
    return list(await asyncio.gather(*(call(toolset, "slow", label=str(i)) for i in range(calls))))


async def _traced(url: str) -> list[Any]:
    """One ``slow`` call and one failing ``boom`` call, traced (OTEL_* from the environment)."""
    telemetry.install("worker")
    toolset = limited(open_store(url), url, 2, 0.01)
    return [await call(toolset, "slow", label="traced"), await call(toolset, "boom")]


async def _hold(url: str, lease_s: float) -> Any:
    """One long ``slow`` call holding the one slot under a short lease (to be killed)."""
    toolset = limited(open_store(url), url, 1, 60, lease_s=lease_s)
    return await call(toolset, "slow", label="held")


if __name__ == "__main__":
    if sys.argv[1] == "--hold":
        print(json.dumps(asyncio.run(_hold(sys.argv[2], float(sys.argv[3])))))
        sys.exit(0)
    if sys.argv[1] == "--traced":
        print(json.dumps(asyncio.run(_traced(sys.argv[2]))))
        sys.exit(0)
    url, calls, limit, sleep_s, parties = sys.argv[1:6]
    results = asyncio.run(_main(url, int(calls), int(limit), float(sleep_s), int(parties)))
    print(json.dumps(results))
