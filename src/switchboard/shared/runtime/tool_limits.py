"""Every tool server's calls, capped fleet-wide, counted and traced: one toolset wrapper.

`FleetLimitedToolset` wraps the toolset of one tool server (an MCP server's, a Python tool
package's) and gives each of its calls:

- a slot of the server's ``maxConcurrent`` when it has one: a lease in Redis shared by
  every worker (`ToolSlotStore`), waited for as a coroutine (`slot_limiter`: the wait holds
  no worker slot, thread or connection), renewed while a long call runs, given back when
  it ends (in the background: the call's answer does not wait for the round trip);
- an outcome the run goes on with: a call that raises (an MCP error result, a server that
  is down), runs past ``call_timeout_s``, or waits past ``slot_timeout_s`` for a slot
  returns a tool error for the model to read (``{"status": "error", "tool", "error"}``, as
  the session tools do), as a `ToolReturn` whose metadata names its kind (``{"toolError":
  "error" | "timeout" | "unavailable" | "no_slot"}``; a `ToolCallFailed` gives its own
  ``outcome``). A call that must wait for another run (`CallDeferred`,
  `ApprovalRequired`) and a store outage (`StoreUnavailable`: the attempt is retried) pass
  through;
- its metrics per server (`ToolMetrics`: calls, errors by kind, latency, slot wait, in
  flight, waiting) and an OpenTelemetry ``execute_tool`` span with the GenAI attributes.

Wiring a server with its config is one line (`for_server` with the process's services)::

    toolset = for_server(toolset, name, server.max_concurrent, svc)
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry
from pydantic_ai.messages import ToolReturn
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from switchboard import telemetry
from switchboard.shared.errors import InvalidInput, StoreUnavailable
from switchboard.shared.metrics import ToolMetrics
from switchboard.shared.runtime.mcp_tools import ToolCallFailed
from switchboard.shared.runtime.slot_limiter import DEFAULT_LEASE_S, NoSlot, limiter_for
from switchboard.shared.runtime.slot_limiter import SlotLimiter as SlotLimiter
from switchboard.shared.services import Services
from switchboard.shared.store.tool_slots import ToolSlotStore

__all__ = [
    "DEFAULT_SLOT_TIMEOUT_S",
    "ERROR_KEY",
    "FleetLimitedToolset",
    "SlotLimiter",
    "for_server",
    "server_label",
]

log = logging.getLogger("switchboard.tools")

# How long a call waits for a slot of its server before it returns a tool error (s).
DEFAULT_SLOT_TIMEOUT_S = 120.0
# The metadata key of a tool error's `ToolReturn`: the error's kind.
ERROR_KEY = "toolError"
# A server name is a Redis key part and a metrics label: no braces (hash tags), spaces or
# glob characters (`server_label` makes one of any name).
_SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_OUTSIDE = re.compile(r"[^A-Za-z0-9_.-]")
# What passes through unchanged: waits for another run, and a store outage (retried).
_PASSED = (CallDeferred, ApprovalRequired, StoreUnavailable)


@dataclass(init=False)
class FleetLimitedToolset(WrapperToolset[AgentDepsT]):
    """One tool server's toolset, its calls capped by ``max_concurrent`` across the fleet
    (None: no cap), counted in ``metrics`` and traced (see the module)."""

    server: str
    limiter: SlotLimiter | None
    metrics: ToolMetrics | None
    slot_timeout_s: float
    call_timeout_s: float | None

    def __init__(
        self,
        wrapped: AbstractToolset[AgentDepsT],
        *,
        server: str,
        max_concurrent: int | None = None,
        slots: ToolSlotStore | None = None,
        metrics: ToolMetrics | None = None,
        slot_timeout_s: float = DEFAULT_SLOT_TIMEOUT_S,
        call_timeout_s: float | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        limiter: SlotLimiter | None = None,
    ) -> None:
        if not _SERVER_NAME.match(server):
            raise InvalidInput(f"a tool server's name is letters, digits, _ . -: {server!r}")
        if limiter is None and max_concurrent is not None:
            if max_concurrent < 1 or slots is None:
                raise InvalidInput(f"maxConcurrent of {server!r} must be 1 or more, with a store")
            limiter = limiter_for(slots, server, max_concurrent, lease_s=lease_s)
        super().__init__(wrapped)
        self.server = server
        self.limiter = limiter
        self.metrics = metrics
        self.slot_timeout_s = slot_timeout_s
        self.call_timeout_s = call_timeout_s

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        """Call the tool within a slot; an error or timeout is the call's tool error."""
        call = _Call(self.server)
        described = tool.tool_def.description
        with telemetry.execute_tool(
            name, ctx.tool_call_id, server=self.server, description=described
        ) as span:
            try:
                return await self._limited(call, name, tool_args, ctx, tool)
            except _PASSED:
                raise
            except Exception as exc:
                kind, message = _error_of(exc, self)
                span.error(kind, message)
                call.error = kind
                log.info("tool call %s on %s: %s", name, self.server, kind)
                error = {"status": "error", "tool": name, "error": message}
                return ToolReturn(return_value=error, metadata={ERROR_KEY: kind})
            finally:
                if self.metrics is not None:
                    self.metrics.ended(self.server, call.ran_s(), call.error)

    async def _limited(
        self,
        call: _Call,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        """The wrapped call, in a slot of the server when it is capped."""
        limiter = self.limiter
        if limiter is None:
            return await self._counted(call, name, tool_args, ctx, tool)
        holder = uuid.uuid4().hex
        waited_at = time.perf_counter()
        await limiter.acquire(holder, self.slot_timeout_s, self._on_wait)
        if self.metrics is not None:
            self.metrics.slot_wait.labels(self.server).observe(time.perf_counter() - waited_at)
        keeper = asyncio.create_task(limiter.keep(holder))
        try:
            return await self._counted(call, name, tool_args, ctx, tool)
        finally:
            keeper.cancel()
            limiter.release_soon(holder)  # the call's answer does not wait for it

    async def _counted(
        self,
        call: _Call,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        """The wrapped call, in flight (the gauge) and timed."""
        gauge = self.metrics.in_flight.labels(self.server) if self.metrics is not None else None
        if gauge is not None:
            gauge.inc()
        call.started = time.perf_counter()
        try:
            async with asyncio.timeout(self.call_timeout_s):
                return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        finally:
            call.ended = time.perf_counter()
            if gauge is not None:
                gauge.dec()

    def _on_wait(self, delta: int) -> None:
        if self.metrics is not None:
            self.metrics.waiting.labels(self.server).inc(delta)


def for_server(
    toolset: AbstractToolset[AgentDepsT],
    server: str,
    max_concurrent: int | None,
    svc: Services,
    *,
    call_timeout_s: float | None = None,
) -> FleetLimitedToolset[AgentDepsT]:
    """``toolset``, the tools of the server ``server``, capped at ``max_concurrent`` calls
    fleet-wide (None: no cap) in the process's store, counted in its metrics."""
    return FleetLimitedToolset(
        toolset,
        server=server,
        max_concurrent=max_concurrent,
        slots=svc.store.tool_slots,
        metrics=svc.metrics.tools,
        call_timeout_s=call_timeout_s,
    )


def server_label(name: str) -> str:
    """A configured server's name as its slots' key and its metrics label: the name
    itself when it is letters, digits, ``_ . -`` (a letter or digit first), else those
    characters of it and a digest of the whole (two names never share a label)."""
    if _SERVER_NAME.match(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{_OUTSIDE.sub('-', name)[:100].strip('-.') or 'server'}-{digest}".lstrip("_-.")


@dataclass
class _Call:
    """One call as it is counted: when it ran, and the kind of its error."""

    server: str
    started: float | None = None
    ended: float | None = None
    error: str | None = None

    def ran_s(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.perf_counter()) - self.started


def _error_of(exc: Exception, toolset: FleetLimitedToolset[Any]) -> tuple[str, str]:
    """The kind (a metrics label, the span's ``error.type``) and the model's text of an
    error a call ended with."""
    if isinstance(exc, ToolCallFailed):
        return exc.outcome, exc.message
    if isinstance(exc, NoSlot):
        return "no_slot", f"{exc} (waited {toolset.slot_timeout_s:g}s)"
    if isinstance(exc, TimeoutError):
        limit = toolset.call_timeout_s
        return "timeout", f"the call timed out after {limit:g}s" if limit else "the call timed out"
    if isinstance(exc, ModelRetry):
        return "error", exc.message
    return "error", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
