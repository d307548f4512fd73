"""The tools a run gets beside the session tools: MCP servers and Python tools.

`ExternalTools` is the process's: its MCP servers (`mcp.servers`, one connection per run
loop, kept across runs: `mcp_tools.McpServer`) and the Python tools the installed packages
register (`python_tools`). Each run gets a `RunTools` (a pydantic-ai toolset) that offers
what the policy permits it, under OpenClaw's names (``<server>__<tool>``, `tool_names`).

Each call is made through its server's `ServerCalls`: within a slot of the server's
``maxConcurrent`` (fleet-wide, in Redis; a call waiting for one holds no worker slot),
counted in the process's metrics per server and traced (``execute_tool``). A call's return
is what the tool answered, or ``{"status": "error", "tool", "error"}`` when it failed,
timed out, its server is down or no slot came free in time: the run goes on. A result longer than
`MAX_RESULT_CHARS` characters (as JSON) is cut there and marked (`CUT_MARKER`). Each call's
return carries a record for the transcript (the toolResult's ``call``): server, tool,
arguments (credentials redacted), duration, outcome.

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
from functools import partial
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
from switchboard.shared.runtime.mcp_tools import McpServer, ToolCallFailed
from switchboard.shared.runtime.python_tools import PythonTools, load_python_tools
from switchboard.shared.runtime.server_calls import NoSlot, ServerCalls, SlotWait
from switchboard.shared.runtime.slot_limiter import DEFAULT_LEASE_S
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
    """This process's MCP servers and Python tools (connected and loaded on first use)."""

    def __init__(
        self,
        servers: Mapping[str, McpServerConfig],
        load: Callable[[], list[PythonTools]] = load_python_tools,
        *,
        slots: ToolSlotStore | None = None,
        metrics: ToolMetrics | None = None,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        self._configs = {name: c for name, c in servers.items() if c.enabled}
        self._load = load
        self._python: list[PythonTools] | None = None
        self._lock = threading.Lock()
        self._slots = slots
        self._metrics = metrics
        self._lease_s = lease_s
        self._calls: dict[str, ServerCalls] = {}
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
        return RunTools(self._servers(), self.python(), permit, self.calls_of)

    def calls_of(self, server: str) -> ServerCalls:
        """The calls of the server (or Python tool package) ``server``: capped by its
        ``maxConcurrent`` when it has one and the process a store (made once)."""
        with self._lock:
            calls = self._calls.get(server)
            if calls is None:
                config = self._configs.get(server)
                cap = config.max_concurrent if config is not None and self._slots else None
                calls = ServerCalls.of(
                    server, cap, self._slots, self._metrics, lease_s=self._lease_s
                )
                self._calls[server] = calls
            return calls

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


class RunTools(AbstractToolset[ToolRun]):
    """One run's MCP and Python tools, named for the model and permitted by policy."""

    def __init__(
        self,
        servers: Mapping[str, McpServer],
        python: Sequence[PythonTools],
        permit: Permit,
        calls_of: Callable[[str], ServerCalls] | None = None,
    ) -> None:
        self._servers = servers
        self._python = python
        self._permit = permit
        self._calls_of = calls_of or (lambda server: ServerCalls(server))
        self._routes: dict[str, _Route] = {}
        self._seen: dict[str, int] = {}

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
        outcome = "ok"
        calls = self._calls_of(route.server)
        call = partial(self._call, route, name, tool_args, ctx)
        described = tool.tool_def.description
        waited = SlotWait()
        try:
            value = await calls.run(
                name, ctx.tool_call_id, call, description=described, slot_wait=waited
            )
        except ToolCallFailed as exc:
            outcome = exc.outcome
            value = {"status": "error", "tool": name, "error": exc.message}
        except NoSlot as exc:
            outcome = "no_slot"
            error = f"{exc} (waited {calls.slot_timeout_s:g}s)"
            value = {"status": "error", "tool": name, "error": error}
        duration_ms = round((time.perf_counter() - started) * 1000, 1)
        content, cut = bounded(value)
        record = {
            "server": route.server,
            "tool": route.tool,
            "kind": "mcp" if route.mcp is not None else "python",
            "arguments": _redacted(tool_args),
            "durationMs": duration_ms,
            "outcome": outcome,
            **({"slotWaitMs": round(waited.s * 1000, 1)} if calls.limiter is not None else {}),
            **({"cut": True} if cut else {}),
        }
        return ToolReturn(return_value=content, metadata={"call": record})

    async def _call(
        self, route: _Route, name: str, args: dict[str, Any], ctx: RunContext[ToolRun]
    ) -> Any:
        if route.mcp is not None:
            return await route.mcp.call(route.tool, args, self._meta(name, args, ctx))
        assert route.python is not None and route.inner is not None
        inner_ctx = replace(ctx, tool_name=route.tool)
        try:
            return await route.python.toolset.call_tool(route.tool, args, inner_ctx, route.inner)
        except Exception as exc:  # the tool's failure is the model's to read
            raise ToolCallFailed(f"{route.tool}: {type(exc).__name__}: {exc}") from None

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
