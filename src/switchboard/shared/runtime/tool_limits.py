"""A tool server's toolset, its calls capped fleet-wide, counted and traced: a wrapper.

`FleetLimitedToolset` wraps the toolset of one tool server (a pydantic-ai toolset: an MCP
server's, a Python tool package's) and makes each of its calls through the server's
`ServerCalls` (a slot of its ``maxConcurrent``, a timeout, metrics, an ``execute_tool``
span). A call that raises (an MCP error result, a server that is down), runs past its
timeout, or waits past its slot timeout returns a tool error for the model to read
(``{"status": "error", "tool", "error"}``, as the session tools do): the run goes on. A
call that must wait for another run (`CallDeferred`, `ApprovalRequired`) and a store
outage (`StoreUnavailable`: the attempt is retried) pass through.

Wiring a server with its config is one line (`for_server` with the process's services)::

    toolset = for_server(toolset, name, server.max_concurrent, svc)

(The product's MCP servers and Python tools share one toolset per run,
`external_tools.RunTools`, which makes each call through its server's `ServerCalls`.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from switchboard.shared.metrics import ToolMetrics
from switchboard.shared.runtime.server_calls import (
    DEFAULT_SLOT_TIMEOUT_S,
    PASSED,
    ServerCalls,
    error_kind,
)
from switchboard.shared.runtime.slot_limiter import DEFAULT_LEASE_S
from switchboard.shared.runtime.slot_limiter import SlotLimiter as SlotLimiter
from switchboard.shared.services import Services
from switchboard.shared.store.tool_slots import ToolSlotStore

__all__ = [
    "DEFAULT_SLOT_TIMEOUT_S",
    "FleetLimitedToolset",
    "ServerCalls",
    "SlotLimiter",
    "for_server",
]

log = logging.getLogger("switchboard.tools")


@dataclass(init=False)
class FleetLimitedToolset(WrapperToolset[AgentDepsT]):
    """One tool server's toolset, its calls capped by ``max_concurrent`` across the fleet
    (None: no cap), counted in ``metrics`` and traced (see the module)."""

    calls: ServerCalls

    def __init__(
        self,
        wrapped: AbstractToolset[AgentDepsT],
        *,
        server: str = "",
        max_concurrent: int | None = None,
        slots: ToolSlotStore | None = None,
        metrics: ToolMetrics | None = None,
        slot_timeout_s: float = DEFAULT_SLOT_TIMEOUT_S,
        call_timeout_s: float | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        calls: ServerCalls | None = None,
    ) -> None:
        super().__init__(wrapped)
        self.calls = calls or ServerCalls.of(
            server,
            max_concurrent,
            slots,
            metrics,
            lease_s=lease_s,
            slot_timeout_s=slot_timeout_s,
            call_timeout_s=call_timeout_s,
        )

    @property
    def server(self) -> str:
        """The tool server's name."""
        return self.calls.server

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        """Call the tool within a slot; an error or timeout is the call's tool error."""
        call = partial(self.wrapped.call_tool, name, tool_args, ctx, tool)
        described = tool.tool_def.description
        try:
            return await self.calls.run(name, ctx.tool_call_id, call, description=described)
        except PASSED:
            raise
        except Exception as exc:
            kind = error_kind(exc)
            log.info("tool call %s on %s: %s", name, self.server, kind)
            return {"status": "error", "tool": name, "error": _message(exc, kind, self.calls)}


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


def _message(exc: Exception, kind: str, calls: ServerCalls) -> str:
    """The model's text of an error a call ended with."""
    if kind == "no_slot":
        return f"{exc} (waited {calls.slot_timeout_s:g}s)"
    if kind == "timeout" and isinstance(exc, TimeoutError):
        limit = calls.call_timeout_s
        return f"the call timed out after {limit:g}s" if limit else "the call timed out"
    if isinstance(exc, ModelRetry):
        return exc.message
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
