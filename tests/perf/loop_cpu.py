"""CPU per run of the model loop (`agent_loop.run_model_loop`) of the sources on PYTHONPATH.

Not a test: a measurement to compare two checkouts on the same machine, alternated.

    python tests/perf/loop_cpu.py echo text 2000 100
    python -m switchboard_testkit.fake_model --port 18781 --latency-ms 50 &
    python tests/perf/loop_cpu.py http tool 2000 200 http://127.0.0.1:18781/v1

``echo`` runs on `builtin/echo`, ``http`` through the OpenAI client against an
OpenAI-compatible server. ``text`` is a run answered with text (one request); ``tool`` a run
whose model calls one tool, then answers (two requests); six tools are offered. The runs go
``inflight`` at a time on one uvloop loop, after 200 of warm-up; it prints one JSON line
with the CPU of the whole process (every thread) per run. To measure an older checkout,
put its sources first on PYTHONPATH (e.g. `git archive <commit> src | tar -x -C /tmp/old`);
a checkout whose `resolve_model` takes ``fast_paths`` gets it from a sixth argument
``fast``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import uvloop
from pydantic_ai.messages import ModelRequest, UserPromptPart

from switchboard.shared.runtime import agent_loop, models
from switchboard.shared.services import ToolContext, ToolSpec

PROMPTS = {"text": "hello there, how are you", "tool": '/tool echo {"x": 1}'}
SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}
SPECS = [ToolSpec(f"t{i}", "A tool.", SCHEMA, lambda c, a: {"ok": True}) for i in range(5)]
SPECS.append(ToolSpec("echo", "Echo the arguments.", SCHEMA, lambda c, a: {"got": a}))
CTX = ToolContext(services=cast(Any, None), session_key="agent:main:main", agent_id="main")


@dataclass
class Provider:
    """`models.providers.fake`: the OpenAI-compatible server under test."""

    base_url: str | None = None
    api_key: str | None = "none"
    api: str | None = "openai-completions"


def _tools() -> dict[str, Any]:
    try:  # the tools as a toolset
        from switchboard.shared.runtime.toolset import toolset_for
    except ImportError:  # an older checkout: the specs themselves
        return {"specs": SPECS}
    return {"tools": toolset_for(SPECS)}


def _model(kind: str, base_url: str | None, fast: bool) -> Any:
    if kind == "echo":
        return models.resolve_model("builtin/echo", {})
    kw: dict[str, Any] = {}
    if "fast_paths" in models.resolve_model.__code__.co_varnames:
        kw["fast_paths"] = fast
    return models.resolve_model("fake/fake-model", {"fake": Provider(base_url)}, **kw)


async def measure(kind: str, scenario: str, runs: int, inflight: int, *rest: str) -> None:
    """Run ``runs`` runs, ``inflight`` at a time, and print the CPU each took."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(8))
    model = _model(kind, rest[0] if rest else None, rest[1:] == ("fast",))
    tools = _tools()

    async def one() -> None:
        history = [ModelRequest(parts=[UserPromptPart(PROMPTS[scenario])])]
        result = await agent_loop.run_model_loop(
            model,
            ctx=CTX,
            history=history,
            instructions="be brief",
            defer=lambda wait: {},
            before_tools=lambda: None,
            **tools,
        )
        assert isinstance(result.output, str), result.output

    async def batch(n: int) -> None:
        for start in range(0, n, inflight):
            await asyncio.gather(*[one() for _ in range(min(inflight, n - start))])

    await batch(max(inflight, 200))
    cpu, wall = time.process_time(), time.perf_counter()
    await batch(runs)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    line = {"kind": kind, "scenario": scenario, "runs": runs, "inflight": inflight}
    line |= {"cpu_ms_per_run": round(cpu / runs * 1000, 3), "wall_s": round(wall, 2)}
    print(json.dumps(line))


if __name__ == "__main__":
    kind, scenario, runs, inflight, *rest = sys.argv[1:]
    uvloop.run(measure(kind, scenario, int(runs), int(inflight), *rest))
