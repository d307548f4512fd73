"""The tools a run gets beside the session tools: MCP servers and Python tools.

`ExternalTools` is the process's: its MCP servers (`mcp.servers`, one connection per run
loop, kept across runs: `mcp_tools.McpServer`) and the Python tools the installed packages
register (`python_tools`). Each run gets a `RunTools` (a pydantic-ai toolset) that offers
what the policy permits it, under OpenClaw's names (``<server>__<tool>``, `tool_names`).

A call's return is what the tool answered, or ``{"status": "error", "tool", "error"}``
when it failed, timed out or its server is down: the run goes on. A result longer than
`MAX_RESULT_CHARS` characters (as JSON) is cut there and marked (`CUT_MARKER`). Each call's
return carries a record for the transcript (the toolResult's ``call``): server, tool,
arguments (credentials redacted), duration (``durationMs``, the whole call as the run
waited for it; ``slotWaitMs`` of it waiting for a slot of a capped server), outcome
(``ok``, ``error``, ``timeout``, ``unavailable``, ``no_slot``).

Every server's calls (an MCP server's, a Python tool package's) pass through its
`FleetLimitedToolset` (`tool_limits`): capped at the server's ``maxConcurrent`` across the
fleet, counted in the process's metrics and traced. It is the one place a call's failure
becomes the model's tool error; this toolset only routes the call and records it.

A call a dead worker left in flight is repeated by the run's next attempt only if its
model asks again; the repeat carries the same idempotency key in the MCP request's
``_meta`` (``switchboard/idempotencyKey``: the run, the tool, its arguments and how many
such calls came before in the run), so a server can answer it without acting twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import weakref
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
from pydantic_ai import RunContext
from pydantic_ai.messages import ToolReturn
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from switchboard.redact import redact_text
from switchboard.shared.config import McpServerConfig
from switchboard.shared.metrics import ToolMetrics
from switchboard.shared.runtime.mcp_tools import McpServer
from switchboard.shared.runtime.python_tools import PythonTools, load_python_tools
from switchboard.shared.runtime.slot_limiter import SlotLimiter
from switchboard.shared.runtime.tool_limits import ERROR_KEY, FleetLimitedToolset, server_label
from switchboard.shared.runtime.tool_names import assign_names
from switchboard.shared.runtime.toolset import MAX_RETRIES, ToolRun
from switchboard.shared.store.tool_slots import ToolSlotStore

__all__ = ["CUT_MARKER", "MAX_RESULT_CHARS", "META_KEY", "ExternalTools", "RunTools"]

MAX_RESULT_CHARS = 32_000
CUT_MARKER = "\n…(result cut at {kept} of {total} characters)"
META_KEY = "switchboard/idempotencyKey"

_ARGS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))
# Which tools a run may use, of the names offered: the policy's answer.
Permit = Callable[[Sequence[str]], Collection[str]]


class ExternalTools:
    """This process's MCP servers and Python tools (connected and loaded on first use), the
    slots of its capped servers in ``slots``, their calls counted in ``metrics``."""

    def __init__(
        self,
        servers: Mapping[str, McpServerConfig],
        *,
        slots: ToolSlotStore,
        metrics: ToolMetrics | None,
        load: Callable[[], list[PythonTools]] = load_python_tools,
    ) -> None:
        self._configs = {name: c for name, c in servers.items() if c.enabled}
        self._load = load
        self._metrics = metrics
        # One limiter per capped server for the whole process: its waiting calls, on any
        # of the run loops, queue together.
        self._limiters = {
            name: SlotLimiter(slots, server_label(name), c.max_concurrent)
            for name, c in self._configs.items()
            if c.max_concurrent is not None
        }
        self._python: list[PythonTools] | None = None
        self._lock = threading.Lock()
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, McpServer]] = (
            weakref.WeakKeyDictionary()
        )

    def python(self) -> list[PythonTools]:
        """The Python tools of the installed packages (loaded once)."""
        with self._lock:
            if self._python is None:
                self._python = self._load()
            return self._python

    def known_names(self) -> list[str]:
        """The tools' names as known here: a server not listed yet shows as ``<server>__*``."""
        listed: dict[str, list[str]] = {}
        for servers in list(self._loops.values()):
            for name, server in servers.items():
                if server.tools:
                    listed[name] = list(server.tools)
        groups = [(name, listed.get(name, ["*"])) for name in self._configs]
        for py in self.python():
            tools = getattr(py.toolset, "tools", None)  # a FunctionToolset's, by name
            groups.append((py.name, list(tools) if isinstance(tools, Mapping) else ["*"]))
        return list(assign_names(groups))

    def toolset(self, permit: Permit) -> RunTools | None:
        """A run's toolset of what ``permit`` lets it use (None: nothing configured)."""
        if not self._configs and not self.python():
            return None
        return RunTools(
            self._servers(), self.python(), permit, limiters=self._limiters, metrics=self._metrics
        )

    async def aclose(self) -> None:
        """Close the running loop's MCP connections."""
        for server in self._loops.pop(asyncio.get_running_loop(), {}).values():
            await server.close()

    def _servers(self) -> dict[str, McpServer]:
        loop = asyncio.get_running_loop()
        servers = self._loops.get(loop)
        if servers is None:
            servers = {name: McpServer(name, c) for name, c in self._configs.items()}
            self._loops[loop] = servers
        return servers


@dataclass(frozen=True)
class _Route:
    """Where a model-facing name leads: a server's tool or a Python tool."""

    server: str
    tool: str
    mcp: McpServer | None = None
    python: PythonTools | None = None
    inner: ToolsetTool[Any] | None = None

    @property
    def key(self) -> tuple[str, str]:
        """Its server's key among the run's limited toolsets (an MCP server, a package)."""
        return ("mcp" if self.mcp is not None else "python", self.server)


@dataclass(frozen=True)
class _Answer:
    """A call's result, and when it started (after its slot, if it waited for one)."""

    value: Any
    started: float


class _ServerCalls(AbstractToolset[ToolRun]):
    """One server's calls as the run routes them: the toolset its limiter wraps."""

    def __init__(
        self, server: str, call: Callable[[str, dict[str, Any], RunContext[ToolRun]], Any]
    ) -> None:
        self._server = server
        self._call = call

    @property
    def id(self) -> str:
        return f"switchboard-tools-{self._server}"

    async def get_tools(self, ctx: RunContext[ToolRun]) -> dict[str, ToolsetTool[ToolRun]]:
        return {}  # `RunTools` lists and names the tools

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[ToolRun],
        tool: ToolsetTool[ToolRun],
    ) -> _Answer:
        started = time.perf_counter()
        return _Answer(await self._call(name, tool_args, ctx), started)


class RunTools(AbstractToolset[ToolRun]):
    """One run's MCP and Python tools, named for the model and permitted by policy, each
    server's calls through its `FleetLimitedToolset` (its ``limiters``, ``metrics``)."""

    def __init__(
        self,
        servers: Mapping[str, McpServer],
        python: Sequence[PythonTools],
        permit: Permit,
        *,
        limiters: Mapping[str, SlotLimiter],
        metrics: ToolMetrics | None,
    ) -> None:
        self._servers = servers
        self._python = python
        self._permit = permit
        self._routes: dict[str, _Route] = {}
        self._seen: dict[str, int] = {}
        self._capped = set(limiters)
        self._limited = {
            ("mcp", name): FleetLimitedToolset(
                _ServerCalls(name, self._call),
                server=server_label(name),
                limiter=limiters.get(name),
                metrics=metrics,
                # A call waits for a slot as long as it may then run: requestTimeoutMs.
                slot_timeout_s=server.config.request_timeout_ms / 1000,
            )
            for name, server in servers.items()
        }
        for py in python:
            calls = _ServerCalls(py.name, self._call)
            limited = FleetLimitedToolset(calls, server=server_label(py.name), metrics=metrics)
            self._limited["python", py.name] = limited

    @property
    def id(self) -> str:
        return "switchboard-external"

    async def __aenter__(self) -> RunTools:
        for py in self._python:
            await py.toolset.__aenter__()
        return self

    async def __aexit__(self, *args: Any) -> bool | None:
        for py in reversed(self._python):
            await py.toolset.__aexit__(*args)
        return None

    async def get_tools(self, ctx: RunContext[ToolRun]) -> dict[str, ToolsetTool[ToolRun]]:
        await asyncio.gather(*(s.refresh() for s in self._servers.values()))
        inner = {py.name: await py.toolset.get_tools(ctx) for py in self._python}
        groups = [(name, list(s.tools)) for name, s in self._servers.items()]
        groups += [(py.name, list(inner[py.name])) for py in self._python]
        names = assign_names(groups)
        allowed = set(self._permit(list(names)))
        python = {py.name: py for py in self._python}
        tools: dict[str, ToolsetTool[ToolRun]] = {}
        for name, (server, tool) in names.items():
            if name not in allowed:
                continue
            if server in python:
                found = inner[server][tool]
                route = _Route(server, tool, python=python[server], inner=found)
                definition, validator = found.tool_def, found.args_validator
            else:
                mcp_tool = self._servers[server].tools[tool]
                route = _Route(server, tool, mcp=self._servers[server])
                definition = ToolDefinition(
                    name=tool,
                    description=mcp_tool.description,
                    parameters_json_schema=dict(mcp_tool.input_schema),
                )
                validator = _ARGS
            self._routes[name] = route
            tools[name] = ToolsetTool[ToolRun](
                toolset=self,
                tool_def=replace(definition, name=name, sequential=True),
                max_retries=MAX_RETRIES,
                args_validator=validator,
            )
        return tools

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[ToolRun],
        tool: ToolsetTool[ToolRun],
    ) -> ToolReturn:
        route = self._routes[name]
        started = time.perf_counter()
        answer = await self._limited[route.key].call_tool(name, tool_args, ctx, tool)
        extra: dict[str, Any] = {}
        if isinstance(answer, ToolReturn):  # the limiter's tool error, its kind beside it
            outcome = str((answer.metadata or {}).get(ERROR_KEY, "error"))
            value = answer.return_value
        else:
            outcome, value = "ok", answer.value
            if route.key[0] == "mcp" and route.server in self._capped:
                extra["slotWaitMs"] = _ms(answer.started - started)
        content, cut = bounded(value)
        record = {
            "server": route.server,
            "tool": route.tool,
            "kind": route.key[0],
            "arguments": _redacted(tool_args),
            "durationMs": _ms(time.perf_counter() - started),
            **extra,
            "outcome": outcome,
            **({"cut": True} if cut else {}),
        }
        return ToolReturn(return_value=content, metadata={"call": record})

    async def _call(self, name: str, args: dict[str, Any], ctx: RunContext[ToolRun]) -> Any:
        """The routed call itself (its failure is the limiter's to turn into a tool error)."""
        route = self._routes[name]
        if route.mcp is not None:
            return await route.mcp.call(route.tool, args, self._meta(name, args, ctx))
        assert route.python is not None and route.inner is not None
        inner_ctx = replace(ctx, tool_name=route.tool)
        return await route.python.toolset.call_tool(route.tool, args, inner_ctx, route.inner)

    def _meta(self, name: str, args: dict[str, Any], ctx: RunContext[ToolRun]) -> dict[str, Any]:
        """The MCP request's ``_meta``: the call's idempotency key (see the module doc)."""
        run_id = ctx.deps.ctx.run_id or ""
        body = orjson.dumps(args, option=orjson.OPT_SORT_KEYS, default=str)
        seen_key = f"{name}\0{body.decode()}"
        ordinal = self._seen.get(seen_key, 0)
        self._seen[seen_key] = ordinal + 1
        digest = hashlib.sha256(f"{run_id}\0{seen_key}\0{ordinal}".encode()).hexdigest()
        return {META_KEY: f"{run_id}:{digest[:32]}", "switchboard/runId": run_id}


def bounded(value: Any) -> tuple[Any, bool]:
    """A tool's return within `MAX_RESULT_CHARS` (as JSON), and whether it was cut."""
    plain = isinstance(value, str) or _plain(value)
    text = value if isinstance(value, str) else _json_text(value)
    if len(text) <= MAX_RESULT_CHARS:
        return (value if plain else text), False
    kept = text[:MAX_RESULT_CHARS]
    return kept + CUT_MARKER.format(kept=MAX_RESULT_CHARS, total=len(text)), True


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _plain(value: Any) -> bool:
    """Whether the value is JSON as it is (kept as the model's tool return)."""
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


def _json_text(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return str(value)


def _redacted(value: Any) -> Any:
    """The arguments with credential-looking strings masked (as in messages)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    return value
