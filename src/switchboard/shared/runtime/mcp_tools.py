"""One MCP server (`mcp.servers.<name>`) as a worker's run loop reaches it.

The connection is pydantic-ai's `MCPToolset` (on the FastMCP client and the official
`mcp` SDK), entered once by a holder task of its own and kept open across runs: a stdio
server is a child process of the worker for as long as the connection lives, an HTTP
server one session. Runs only call tools on it (`call`), never open or close it.

- The first run that needs the server connects it (within `connectionTimeoutMs`); runs
  arriving meanwhile wait for the same connection. Later connections are not waited for
  by runs starting (they offer the tools listed last), only by calls to the server.
- A server that cannot be reached is tried again after a backoff (1 s, doubling up to
  30 s); meanwhile its tools' calls answer at once with a tool error naming the cause.
  The tools it listed last stay offered, so the model sees the error, not a missing tool.
- A call that fails other than with the server's own tool error (the child process died,
  the HTTP session broke) drops the connection: the next call connects again (a new child
  process, a new session). The failed call itself is not repeated (it may have run).
- A call past `requestTimeoutMs` answers a timeout error; the connection is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from typing import Any

from fastmcp.client.transports import (
    ClientTransport,
    SSETransport,
    StdioTransport,
    StreamableHttpTransport,
)
from fastmcp.exceptions import ToolError
from mcp import types as mcp_types
from pydantic_ai.mcp import MCPToolset

from switchboard.shared.config import McpServerConfig
from switchboard.shared.runtime.tool_names import passes_filter

__all__ = ["McpServer", "ToolCallFailed"]

log = logging.getLogger("switchboard.mcp")

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0


# A connection's answer: the tools the server listed once connected.
_Ready = asyncio.Future[list[mcp_types.Tool]]


class ToolCallFailed(Exception):
    """A call of an MCP or Python tool that did not succeed; ``outcome`` says how
    (``error``: the tool answered an error; ``timeout``; ``unavailable``: not reached)."""

    def __init__(self, message: str, outcome: str = "error") -> None:
        super().__init__(message)
        self.message = message
        self.outcome = outcome


class McpServer:
    """One configured MCP server on one event loop: its connection and its tools."""

    def __init__(self, name: str, config: McpServerConfig) -> None:
        self.name = name
        self.config = config
        self._toolset: MCPToolset[Any] | None = None
        self._ready: _Ready | None = None
        self._stop: asyncio.Event | None = None
        self._holder: asyncio.Task[None] | None = None
        self._first: _Ready | None = None
        self._tools: dict[str, mcp_types.Tool] = {}
        self._error: str | None = None
        self._retry_at = 0.0
        self._backoff = BACKOFF_FIRST_S

    @property
    def tools(self) -> dict[str, mcp_types.Tool]:
        """The server's tools its `toolFilter` offers, as last listed (empty before)."""
        return self._tools

    async def refresh(self) -> None:
        """Start connecting if not connected (and not backing off). Only the process's
        first connection is waited for (its tools are listed for the first runs); later
        runs go on with the tools listed last while a reconnection is under way, so a
        server that is down never holds up runs. Failures are only logged."""
        if self._ready is None and time.monotonic() >= self._retry_at:
            self._connect()
        if self._first is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._first)

    async def call(self, tool: str, arguments: dict[str, Any], meta: dict[str, Any]) -> Any:
        """The tool's result; `ToolCallFailed` when it errs, times out or is not reached."""
        toolset = await self._connected()
        timeout_s = self.config.request_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                return await toolset.direct_call_tool(tool, arguments, metadata=meta)
        except TimeoutError:
            raise ToolCallFailed(
                f"MCP server {self.name!r} did not answer {tool!r} within "
                f"{self.config.request_timeout_ms} ms (requestTimeoutMs)",
                "timeout",
            ) from None
        except ToolError as exc:
            raise ToolCallFailed(f"{tool}: {exc}", "error") from None
        except Exception as exc:
            if toolset is self._toolset:  # not a newer connection made meanwhile
                self._drop(f"{type(exc).__name__}: {exc}")
            raise ToolCallFailed(
                f"MCP server {self.name!r} failed during {tool!r} ({type(exc).__name__}: "
                f"{exc}); it is reconnected for the next call",
                "unavailable",
            ) from None

    async def close(self) -> None:
        """End the connection (the holder exits the toolset: a stdio child is stopped)."""
        self._drop(None)

    async def _connected(self) -> MCPToolset[Any]:
        ready = self._ready
        if ready is None:
            if time.monotonic() < self._retry_at:
                raise ToolCallFailed(self._unavailable(), "unavailable")
            ready = self._connect()
        try:
            await asyncio.shield(ready)
        except Exception:
            raise ToolCallFailed(self._unavailable(), "unavailable") from None
        assert self._toolset is not None
        return self._toolset

    def _unavailable(self) -> str:
        return f"MCP server {self.name!r} is unavailable: {self._error or 'not connected'}"

    def _connect(self) -> _Ready:
        loop = asyncio.get_running_loop()
        ready: _Ready = loop.create_future()
        stop = asyncio.Event()
        toolset: MCPToolset[Any] = MCPToolset(
            _transport(self.config),
            id=self.name,
            tool_error_behavior="error",
            init_timeout=self.config.connection_timeout_ms / 1000,
            read_timeout=max(self.config.request_timeout_ms / 1000, 300.0),
        )
        self._toolset, self._ready, self._stop = toolset, ready, stop
        if self._first is None:
            self._first = ready
        # The holder outlives the run that started it: it runs in an empty context, so
        # it carries none of that run's (log fields, spans) along.
        self._holder = loop.create_task(
            self._hold(toolset, ready, stop), context=contextvars.Context()
        )
        loop.call_later(self.config.connection_timeout_ms / 1000, self._too_slow, ready)
        return ready

    def _too_slow(self, ready: _Ready) -> None:
        if not ready.done():
            timeout = self.config.connection_timeout_ms
            ready.set_exception(TimeoutError(f"no connection within {timeout} ms"))
            self._failed(ready, f"no connection within {timeout} ms (connectionTimeoutMs)")

    async def _hold(self, toolset: MCPToolset[Any], ready: _Ready, stop: asyncio.Event) -> None:
        """Enter the toolset, list its tools, and keep it open until told to stop."""
        try:
            async with toolset:
                listed = await toolset.list_tools()
                if ready.done():  # given up on meanwhile (connectionTimeoutMs)
                    return
                ready.set_result(listed)
                self._listed(listed)
                await stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            self._failed(ready, f"{type(exc).__name__}: {exc}")

    def _listed(self, listed: list[mcp_types.Tool]) -> None:
        flt = self.config.tool_filter
        self._tools = {t.name: t for t in listed if passes_filter(t.name, flt.include, flt.exclude)}
        self._error, self._backoff = None, BACKOFF_FIRST_S
        log.info("MCP server %s connected: %d tool(s)", self.name, len(self._tools))

    def _failed(self, ready: _Ready, error: str) -> None:
        """A connection that failed (or broke): back off before the next try."""
        never_ready = not ready.done() or ready.exception() is not None  # (read: retrieved)
        if ready is not self._ready:
            return  # an older connection's end
        if never_ready:
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
        self._error = error
        self._drop(error)
        log.warning("MCP server %s unavailable: %s", self.name, error)

    def _drop(self, error: str | None) -> None:
        """Forget the current connection (its holder closes it)."""
        if error is not None:
            self._error = error
        if self._stop is not None:
            self._stop.set()
        self._toolset = self._ready = self._stop = None


def _transport(config: McpServerConfig) -> ClientTransport:
    """The FastMCP transport of a configured server."""
    kind = config.kind
    if kind == "stdio":
        return StdioTransport(
            command=str(config.command),
            args=list(config.args),
            env=dict(config.env) or None,
            cwd=config.cwd,
            keep_alive=False,  # its life is the holder's connection
        )
    url = str(config.url)
    headers = dict(config.headers) or None
    if kind == "sse":
        return SSETransport(url, headers=headers)
    return StreamableHttpTransport(url, headers=headers)
