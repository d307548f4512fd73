"""One tool server's calls, however a toolset makes them: capped, counted and traced.

`ServerCalls.run` makes one call of a tool server's tool (an MCP server's, a Python tool
package's) within:

- a slot of the server's ``maxConcurrent`` when it has one: a lease in Redis shared by
  every worker (`ToolSlotStore`), waited for as a coroutine (`slot_limiter`: the wait holds
  no worker slot, thread or connection), renewed while a long call runs, given back when
  it ends; past ``slot_timeout_s`` the call raises `NoSlot`;
- its ``call_timeout_s`` when it has one (`TimeoutError` past it);
- its metrics per server (`ToolMetrics`: calls, errors by kind, latency, slot wait, in
  flight, waiting) and an OpenTelemetry ``execute_tool`` span with the GenAI attributes.

What the call raises is raised on, its kind recorded (`error_kind`): the caller turns it
into the tool error the model reads (`FleetLimitedToolset`, `external_tools.RunTools`).
One `ServerCalls` per server per process serves every run.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pydantic_ai.exceptions import ApprovalRequired, CallDeferred

from switchboard import telemetry
from switchboard.shared.errors import InvalidInput, StoreUnavailable
from switchboard.shared.metrics import ToolMetrics
from switchboard.shared.runtime.slot_limiter import DEFAULT_LEASE_S, NoSlot, limiter_for
from switchboard.shared.runtime.slot_limiter import SlotLimiter as SlotLimiter
from switchboard.shared.store.tool_slots import ToolSlotStore

__all__ = ["DEFAULT_SLOT_TIMEOUT_S", "PASSED", "NoSlot", "ServerCalls", "SlotWait", "error_kind"]

T = TypeVar("T")

# How long a call waits for a slot of its server before it returns a tool error (s).
DEFAULT_SLOT_TIMEOUT_S = 120.0
# What is not a failed call: a wait for another run, and a store outage (retried).
PASSED = (CallDeferred, ApprovalRequired, StoreUnavailable)


class ServerCalls:
    """The calls of one tool server in this process (see the module)."""

    def __init__(
        self,
        server: str,
        *,
        limiter: SlotLimiter | None = None,
        metrics: ToolMetrics | None = None,
        slot_timeout_s: float = DEFAULT_SLOT_TIMEOUT_S,
        call_timeout_s: float | None = None,
    ) -> None:
        if not server:
            raise InvalidInput("a tool server needs a name")
        self.server = server
        self.limiter = limiter
        self.metrics = metrics
        self.slot_timeout_s = slot_timeout_s
        self.call_timeout_s = call_timeout_s

    @classmethod
    def of(
        cls,
        server: str,
        max_concurrent: int | None,
        slots: ToolSlotStore | None,
        metrics: ToolMetrics | None,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        slot_timeout_s: float = DEFAULT_SLOT_TIMEOUT_S,
        call_timeout_s: float | None = None,
    ) -> ServerCalls:
        """The calls of ``server`` capped at ``max_concurrent`` in flight fleet-wide (None:
        no cap) in ``slots``, counted in ``metrics``."""
        limiter = None
        if max_concurrent is not None:
            if max_concurrent < 1 or slots is None:
                raise InvalidInput(f"maxConcurrent of {server!r} must be 1 or more, with a store")
            limiter = limiter_for(slots, server, max_concurrent, lease_s=lease_s)
        return cls(
            server,
            limiter=limiter,
            metrics=metrics,
            slot_timeout_s=slot_timeout_s,
            call_timeout_s=call_timeout_s,
        )

    async def run(
        self,
        name: str,
        call_id: str | None,
        call: Callable[[], Awaitable[T]],
        *,
        description: str | None = None,
        slot_wait: SlotWait | None = None,
    ) -> T:
        """Make ``call`` (of the tool the model knows as ``name``) within a slot, counted
        and traced; what it raises is raised on, recorded as an error of its kind. How long
        it waited for the slot is set on ``slot_wait``."""
        record = _Call(slot_wait=slot_wait)
        with telemetry.execute_tool(
            name, call_id, server=self.server, description=description
        ) as span:
            try:
                return await self._limited(record, call)
            except PASSED:
                raise
            except Exception as exc:
                record.error = error_kind(exc)
                span.error(record.error, message_of(exc))
                raise
            finally:
                if self.metrics is not None:
                    self.metrics.ended(self.server, record.ran_s(), record.error)

    async def _limited(self, record: _Call, call: Callable[[], Awaitable[T]]) -> T:
        """The call, in a slot of the server when it is capped."""
        limiter = self.limiter
        if limiter is None:
            return await self._counted(record, call)
        holder = uuid.uuid4().hex
        waited_at = time.perf_counter()
        await limiter.acquire(holder, self.slot_timeout_s, self._on_wait)
        waited_s = time.perf_counter() - waited_at
        if record.slot_wait is not None:
            record.slot_wait.s = waited_s
        if self.metrics is not None:
            self.metrics.slot_wait.labels(self.server).observe(waited_s)
        keeper = asyncio.create_task(limiter.keep(holder))
        try:
            return await self._counted(record, call)
        finally:
            keeper.cancel()
            await limiter.release(holder)

    async def _counted(self, record: _Call, call: Callable[[], Awaitable[T]]) -> T:
        """The call, in flight (the gauge), timed, and cut at its timeout."""
        gauge = self.metrics.in_flight.labels(self.server) if self.metrics is not None else None
        if gauge is not None:
            gauge.inc()
        record.started = time.perf_counter()
        try:
            async with asyncio.timeout(self.call_timeout_s):
                return await call()
        finally:
            record.ended = time.perf_counter()
            if gauge is not None:
                gauge.dec()

    def _on_wait(self, delta: int) -> None:
        if self.metrics is not None:
            self.metrics.waiting.labels(self.server).inc(delta)


@dataclass
class SlotWait:
    """How long a call waited for its server's slot (s), filled in by `ServerCalls.run`."""

    s: float = 0.0


@dataclass
class _Call:
    """One call as it is counted: when it ran, and the kind of its error."""

    started: float | None = None
    ended: float | None = None
    error: str | None = None
    slot_wait: SlotWait | None = None

    def ran_s(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.perf_counter()) - self.started


def error_kind(exc: BaseException) -> str:
    """The kind of a call's error (a metrics label, the span's ``error.type``): ``no_slot``,
    ``timeout``, the ``outcome`` the error names (an MCP server ``unavailable``), else
    ``error``."""
    if isinstance(exc, NoSlot):
        return "no_slot"
    if isinstance(exc, TimeoutError):
        return "timeout"
    outcome = getattr(exc, "outcome", None)
    return outcome if isinstance(outcome, str) and outcome else "error"


def message_of(exc: BaseException) -> str:
    """What a call's error says: its message, else its type's name."""
    text = getattr(exc, "message", None) or str(exc)
    return str(text) if text else type(exc).__name__
