"""`FleetLimitedToolset` around a real pydantic-ai `FunctionToolset` on a private Redis:
``maxConcurrent`` holds across processes and event loops (measured at the tool), errors and
timeouts come back as tool errors, and every server's calls show in ``/metrics`` and as
``execute_tool`` spans."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis
from pydantic_ai.exceptions import CallDeferred
from pydantic_ai.messages import ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.toolsets import FunctionToolset
from toolcalls import IN_FLIGHT, SEEN, SERVER, call, limited, open_store, probe_toolset

from switchboard.shared.metrics import Metrics, serve
from switchboard.shared.runtime.agent_loop import run_model_loop
from switchboard.shared.runtime.echo import echo_model
from switchboard.shared.runtime.tool_limits import FleetLimitedToolset, for_server
from switchboard.shared.services import Services, ToolContext
from switchboard.shared.store import Store
from switchboard_testkit.up import free_port

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent


@pytest.fixture
def store(redis_url: str) -> Iterator[Store]:
    """The store on the private Redis."""
    s = open_store(redis_url)
    yield s
    s.close()


def _seen(redis_client: redis.Redis) -> list[int]:
    """Every in-flight count a ``slow`` call saw as it started."""
    return [int(n) for n in redis_client.lrange(SEEN, 0, -1)]


def test_max_concurrent_holds_across_two_processes(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """12 concurrent callers in 2 processes, ``max_concurrent=3``: at the tool never more
    than 3 calls in flight, and more than 1; every call ends ok."""
    caller = [sys.executable, str(HERE / "toolcalls.py"), redis_url, "6", "3", "0.3", "2"]
    procs = [subprocess.Popen(caller, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    results = [r for out in outs for r in json.loads(out)]
    assert sorted(results) == sorted(f"done {i}" for i in range(6) for _ in range(2))
    seen = _seen(redis_client)
    assert len(seen) == 12
    assert max(seen) <= 3, seen
    assert max(seen) > 1, seen
    assert int(redis_client.get(IN_FLIGHT) or 0) == 0


def test_max_concurrent_holds_across_two_event_loops(
    store: Store, redis_url: str, redis_client: redis.Redis
) -> None:
    """12 callers on 2 event loops of one process sharing the server's queue: never more
    than 3 in flight at the tool, more than 1, and the loops hand slots to each other."""
    toolset = limited(store, redis_url, 3, 0.2)
    results: list[Any] = []

    def loop_of_six(first: int) -> None:
        async def six() -> list[Any]:
            return list(
                await asyncio.gather(
                    *(call(toolset, "slow", label=str(i)) for i in range(first, first + 6))
                )
            )

        results.extend(asyncio.run(six()))

    started = time.monotonic()
    threads = [threading.Thread(target=loop_of_six, args=(n,)) for n in (0, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    took = time.monotonic() - started
    assert sorted(results) == sorted(f"done {i}" for i in range(12))
    seen = _seen(redis_client)
    assert 1 < max(seen) <= 3, seen
    assert took < 12 * 0.2, f"12 calls of 0.2 s at 3 at a time took {took:.2f}s"
    assert store.tool_slots.held(SERVER) == 0


async def _released(store: Store) -> None:
    """Wait until no slot of the server is held (at most 2 s)."""
    for _ in range(200):
        if store.tool_slots.held(SERVER) == 0:
            return
        await asyncio.sleep(0.01)


def test_errors_and_timeouts_are_tool_errors(store: Store, redis_url: str) -> None:
    """A tool that raises, a call past its timeout and a wait past the slot timeout each
    return a tool error for the model (the run goes on), its kind beside it; the slot is
    given back each time; a deferred call passes through."""
    toolset = limited(store, redis_url, 1, 1.0, call_timeout_s=0.2, slot_timeout_s=0.3)

    async def scenario() -> list[Any]:
        failed = await call(toolset, "boom")
        timed_out = await call(toolset, "slow")
        await _released(store)  # a slot is given back just after its call answers
        store.tool_slots.acquire(SERVER, "elsewhere", 1, 30_000)
        no_slot = await call(toolset, "slow")
        store.tool_slots.release(SERVER, "elsewhere")
        return [failed, timed_out, no_slot]

    failed, timed_out, no_slot = asyncio.run(scenario())
    assert failed == {
        "status": "error",
        "tool": "boom",
        "error": "RuntimeError: the server answered an error",
        "kind": "error",
    }
    assert timed_out["status"] == "error" and "timed out after 0.2s" in timed_out["error"]
    assert timed_out["kind"] == "timeout"
    assert no_slot["status"] == "error" and "busy" in no_slot["error"]
    assert no_slot["kind"] == "no_slot"
    assert store.tool_slots.held(SERVER) == 0

    deferring: FunctionToolset[None] = FunctionToolset()

    @deferring.tool_plain
    def later() -> str:
        """Wait for another run."""
        raise CallDeferred(metadata={"why": "test"})

    wrapped = FleetLimitedToolset(
        deferring, server="waits", max_concurrent=1, slots=store.tool_slots
    )
    with pytest.raises(CallDeferred):
        asyncio.run(call(wrapped, "later"))
    assert store.tool_slots.held("waits") == 0


def _scrape(url: str) -> dict[str, float]:
    """The samples of /metrics whose name starts with ``switchboard_tool``, by full name."""
    text = httpx.get(url, timeout=5).text
    samples = {}
    for line in text.splitlines():
        if line.startswith("switchboard_tool"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_metrics_per_tool_server_in_metrics_endpoint(store: Store, redis_url: str) -> None:
    """/metrics shows a server's calls in flight and waiting while they are, then its
    calls, errors by kind, latency histogram and slot wait."""
    metrics = Metrics()
    port = free_port()
    serve(metrics, "127.0.0.1", port)
    url = f"http://127.0.0.1:{port}/metrics"
    toolset = limited(store, redis_url, 1, 0.6, metrics=metrics.tools)
    label = f'{{server="{SERVER}"}}'

    async def scenario() -> dict[str, float]:
        calls = [asyncio.create_task(call(toolset, "slow")) for _ in range(2)]
        await asyncio.sleep(0.3)
        during = await asyncio.to_thread(_scrape, url)
        await asyncio.gather(*calls)
        await call(toolset, "boom")
        return during

    during = asyncio.run(scenario())
    assert during[f"switchboard_tool_calls_in_flight{label}"] == 1
    assert during[f"switchboard_tool_calls_waiting{label}"] == 1
    after = _scrape(url)
    assert after[f"switchboard_tool_calls_total{label}"] == 3
    assert after[f'switchboard_tool_errors_total{{kind="error",server="{SERVER}"}}'] == 1
    assert after[f"switchboard_tool_call_duration_seconds_count{label}"] == 3
    assert after[f"switchboard_tool_call_duration_seconds_sum{label}"] >= 1.2
    assert after[f"switchboard_tool_slot_wait_seconds_count{label}"] == 3
    assert after[f"switchboard_tool_calls_in_flight{label}"] == 0
    assert after[f"switchboard_tool_calls_waiting{label}"] == 0


def test_unlimited_server_is_counted_too(store: Store, redis_url: str) -> None:
    """A server without ``maxConcurrent`` runs every call at once, counted all the same."""
    metrics = Metrics()
    toolset = FleetLimitedToolset(
        probe_toolset(redis_url, 0.2), server="free", metrics=metrics.tools
    )

    async def five() -> None:
        await asyncio.gather(*(call(toolset, "slow") for _ in range(5)))

    asyncio.run(five())
    assert (
        metrics.registry.get_sample_value("switchboard_tool_calls_total", {"server": "free"}) == 5
    )
    assert store.tool_slots.held("free") == 0


def test_execute_tool_spans_with_genai_attributes(redis_url: str, tmp_path: Path) -> None:
    """With tracing on, each call is an ``execute_tool`` span with the GenAI attributes;
    a failed one carries ``error.type``."""
    receiver_mod = pytest.importorskip("test_telemetry")
    otlp = receiver_mod.OtlpReceiver()
    otlp.thread.start()
    try:
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
        args = [sys.executable, str(HERE / "toolcalls.py"), "--traced", redis_url]
        out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        deadline = time.monotonic() + 10
        spans: list[dict[str, Any]] = []
        while len(spans) < 2 and time.monotonic() < deadline:
            spans = [s for s in otlp.snapshot() if s["name"].startswith("execute_tool")]
            time.sleep(0.05)
    finally:
        otlp.server.shutdown()
        otlp.server.server_close()
    by_name = {s["name"]: s["attributes"] for s in spans}
    slow, boom = by_name["execute_tool slow"], by_name["execute_tool boom"]
    assert slow["gen_ai.operation.name"] == "execute_tool"
    assert slow["gen_ai.tool.name"] == "slow"
    assert slow["gen_ai.tool.call.id"].startswith("call-")
    assert slow["switchboard.tool.server"] == SERVER
    assert slow["gen_ai.tool.description"] == "Sleep a while, counted in flight on the probe key."
    assert "error.type" not in slow
    assert boom["error.type"] == "error"


def test_a_run_goes_on_after_a_tool_error(store: Store, redis_url: str) -> None:
    """In the run's model loop (the echo model), a capped server's failing call comes back
    to the model as a tool error beside the other call's result, and the run ends ok."""
    toolset = limited(store, redis_url, 1, 0.01)
    ctx = ToolContext(services=cast(Any, None), session_key="agent:main:main", agent_id="main")
    prompt = '/tool boom {}\n/tool slow {"label": "after"}'
    result = asyncio.run(
        run_model_loop(
            echo_model(),
            tools=cast(Any, toolset),
            ctx=ctx,
            history=[ModelRequest(parts=[UserPromptPart(prompt)])],
            instructions=None,
            defer=lambda wait: {},
        )
    )
    returns = [p for m in result.messages for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(p.tool_name, p.outcome) for p in returns] == [("boom", "success"), ("slow", "success")]
    assert returns[0].content["status"] == "error"
    assert returns[1].content == "done after"
    assert isinstance(result.output, str) and "done after" in result.output
    assert store.tool_slots.held(SERVER) == 0


def test_a_killed_workers_slot_comes_back_after_its_lease(
    store: Store, redis_url: str, redis_client: redis.Redis
) -> None:
    """A process holding the one slot renews its 1 s lease while its call runs; killed -9
    mid-call, its slot comes back within the lease and a waiting call here takes it."""
    args = [sys.executable, str(HERE / "toolcalls.py"), "--hold", redis_url, "1"]
    holder = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while int(redis_client.get(IN_FLIGHT) or 0) < 1:
            assert time.monotonic() < deadline, "the holder's call never started"
            time.sleep(0.05)
        time.sleep(2)
        assert store.tool_slots.held(SERVER) == 1, "renewed past its 1 s lease while running"
    finally:
        holder.kill()
        holder.wait()
    killed = time.monotonic()
    toolset = limited(store, redis_url, 1, 0.01, slot_timeout_s=10)
    result = asyncio.run(call(toolset, "slow", label="next"))
    took = time.monotonic() - killed
    assert result == "done next"
    assert 0.3 < took < 3, f"the dead holder's slot came back after {took:.2f}s (its lease)"


def test_for_server_wires_the_process_services(services: Services, redis_url: str) -> None:
    """`for_server` caps a server in the services' store and counts it in their metrics,
    as a worker wires each configured tool server."""
    toolset = for_server(probe_toolset(redis_url, 0.2), "wired", 2, services)

    async def four() -> list[Any]:
        return list(await asyncio.gather(*(call(toolset, "slow") for _ in range(4))))

    assert asyncio.run(four()) == ["done "] * 4
    registry = services.metrics.registry
    assert registry.get_sample_value("switchboard_tool_calls_total", {"server": "wired"}) == 4
    waited = registry.get_sample_value(
        "switchboard_tool_slot_wait_seconds_sum", {"server": "wired"}
    )
    assert waited is not None and waited >= 0.3, "two of the four waited a call's length"
    assert services.store.tool_slots.held("wired") == 0
