"""MCP: the session tools for an MCP client acting as one session.

Two ways in, one server: streamable HTTP at ``/mcp`` on the api (bearer token; the session
comes from the ``x-switchboard-session-key`` header, default ``main``) and stdio
(``switchboard mcp --session-key K``). Tools are listed and run exactly as over
``/tools/invoke``: the same offer (sub-agent policy included), the same handlers, waiting
sends awaited on the RunWaiter. Contract outcomes (``status: error | forbidden | timeout``)
are the tool's JSON result; bad arguments and other refusals are MCP tool errors.

A ``tools/call`` carrying a ``progressToken`` gets ``notifications/progress`` about once a
second while the tool waits on a run (a waiting ``sessions_send``, ``agents_wait``,
``subagents`` wait): progress is the seconds waited, total the tool's timeout. The wait is
the same RunWait, wrapped (``_WaitProgress``) so the reporter knows what is being waited on.
MCP Tasks (task-augmented ``tools/call``) are not offered: SDK 2.3.0 ships the wire types of
the 2025-11-25 revision but no server side for them (no task store, no ``tasks/*`` handlers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp.types as types
import orjson
from fastapi import FastAPI, HTTPException, Request
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from switchboard import __version__
from switchboard.api.auth import require_token
from switchboard.api.errors import error_response
from switchboard.api.scopes import (
    OWNER,
    AuditNote,
    Principal,
    ScopeRefused,
    audit_note,
    principal_of,
)
from switchboard.api.tools import RunWait, app_run_wait, call_tool, tool_context, tool_status
from switchboard.shared.errors import StoreUnavailable, SwitchboardError
from switchboard.shared.services import Services
from switchboard.shared.store.aio import AsyncStore
from switchboard.shared.store.runs import RunRecord
from switchboard.shared.tools.offer import tools_for_session
from switchboard.shared.tools.registry import ToolContext

log = logging.getLogger("switchboard.mcp")

PATH = "/mcp"
SESSION_HEADERS = ("x-switchboard-session-key", "x-openclaw-session-key")
UNAVAILABLE = "state store unavailable, retry shortly"

Context = ServerRequestContext[Any, Any]


@dataclass(frozen=True)
class Caller:
    """Who an MCP request acts for, and how it waits for runs."""

    services: Services
    session_ref: str | None
    wait: RunWait
    principal: Principal = OWNER  # a scoped token: its agent, session and tools
    note: AuditNote | None = None  # what a scoped token's request did, for the audit


def build_server(caller_of: Callable[[Context], Caller]) -> Server[Any]:
    """The MCP server; ``caller_of`` tells each request's acting session."""

    async def acting(caller: Caller) -> ToolContext:
        return await run_in_threadpool(
            tool_context, caller.services, caller.session_ref, caller.principal, caller.note
        )

    async def list_tools(
        ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        caller = caller_of(ctx)
        try:
            tctx = await acting(caller)
            offered = await run_in_threadpool(tools_for_session, tctx.services, tctx)
        except ScopeRefused as exc:
            _note_outcome(caller, "refused")
            raise MCPError(types.INVALID_REQUEST, exc.message) from None
        except StoreUnavailable as exc:
            log.warning("redis unavailable: %s", exc.__cause__)
            raise MCPError(types.INTERNAL_ERROR, UNAVAILABLE) from None
        except SwitchboardError as exc:
            raise MCPError(types.INVALID_PARAMS, exc.message) from None
        tools = [
            types.Tool(name=s.name, description=s.description, input_schema=dict(s.parameters))
            for s in offered
            if caller.principal.may_call(s.name)
        ]
        return types.ListToolsResult(tools=tools)

    async def call(ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        caller = caller_of(ctx)
        if caller.note is not None:
            caller.note.tool = params.name
        progress = _WaitProgress(ctx, caller.services) if _wants_progress(ctx) else None
        wait = progress.wrap(caller.wait) if progress is not None else caller.wait
        try:
            tctx = await acting(caller)
            caller.principal.check_tool(params.name)
            async with _reporting(progress):
                result = await call_tool(tctx, params.name, params.arguments or {}, wait)
        except ScopeRefused as exc:
            _note_outcome(caller, "refused")
            return _tool_error(exc.message)
        except StoreUnavailable as exc:
            log.warning("redis unavailable: %s", exc.__cause__)
            _note_outcome(caller, "error")
            return _tool_error(UNAVAILABLE)
        except SwitchboardError as exc:
            _note_outcome(caller, "error")
            return _tool_error(exc.message)
        _note_outcome(caller, tool_status(result))
        text = orjson.dumps(result).decode()
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=result
        )

    return Server(
        "switchboard",
        version=__version__,
        instructions=(
            "Session tools: list sessions, read their history, send into them, spawn "
            "sub-agents, list the agents you may spawn under."
        ),
        on_list_tools=list_tools,
        on_call_tool=call,
    )


# How often a waiting tool call with a progress token hears from the server.
PROGRESS_INTERVAL_S = 1.0


def _wants_progress(ctx: Context) -> bool:
    """Whether the client's ``tools/call`` carried a ``progressToken``."""
    meta: Mapping[str, Any] = ctx.meta or {}
    return meta.get("progress_token", meta.get("progressToken")) is not None


class _WaitProgress:
    """Progress of one tool call's waits on runs, reported to the client once a second.

    ``wrap`` leaves the waiting to the RunWait it wraps and only notes which runs are being
    waited on and since when; ``report`` reads that while a wait is under way.
    """

    def __init__(self, ctx: Context, services: Services) -> None:
        self._ctx = ctx
        self._services = services
        self._waiting: list[str] = []
        self._since: float | None = None
        self._total = 0.0
        self._sent = -1.0

    def wrap(self, wait: RunWait) -> RunWait:
        async def waiting(run_id: str, timeout_s: float) -> RunRecord | None:
            if self._since is None:  # the tool's first wait has its whole timeout
                self._since = asyncio.get_running_loop().time()
                self._total = max(0.0, timeout_s)
            self._waiting.append(run_id)
            try:
                return await wait(run_id, timeout_s)
            finally:
                self._waiting.remove(run_id)

        return waiting

    async def report(self) -> None:
        """Send ``notifications/progress`` every interval a wait is under way, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            if self._since is None or not self._waiting:
                continue
            run_id = self._waiting[0]
            elapsed = round(min(loop.time() - self._since, self._total), 1)
            if elapsed <= self._sent:  # progress only ever increases
                continue
            try:
                status = await run_in_threadpool(self._services.store.runs.status, run_id)
            except StoreUnavailable:
                status = ""
            # A wait token (agents_wait) is no run: it has no status of its own.
            message = f"waiting for run {run_id}: {status}" if status else "waiting"
            try:
                await self._ctx.session.report_progress(elapsed, self._total, message)
            except Exception as exc:  # the client went away: the call itself will end
                log.debug("progress not sent: %s", exc)
                return
            self._sent = elapsed


@contextlib.asynccontextmanager
async def _reporting(progress: _WaitProgress | None) -> AsyncIterator[None]:
    """Run ``progress``'s reporter beside the tool call (nothing without a progress token)."""
    if progress is None:
        yield
        return
    reporter = asyncio.create_task(progress.report())
    try:
        yield
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter


def _note_outcome(caller: Caller, outcome: str) -> None:
    """Tell the audit how a scoped token's MCP request ended (HTTP says 200 either way)."""
    if caller.note is not None:
        caller.note.outcome = outcome


def _tool_error(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )


# ---- streamable HTTP on the api -----------------------------------------------------------


def _http_caller(ctx: Context) -> Caller:
    request = ctx.request
    if not isinstance(request, Request):
        raise MCPError(types.INTERNAL_ERROR, "no HTTP request behind this MCP message")
    app: FastAPI = request.app
    ref = next((v for h in SESSION_HEADERS if (v := request.headers.get(h, "").strip())), None)
    return Caller(
        services=app.state.services,
        session_ref=ref,
        wait=app_run_wait(app),
        principal=principal_of(request),
        note=audit_note(request),
    )


class _Endpoint:
    """`/mcp`: the bearer token first, then the MCP session manager started by the lifespan."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            await require_token(request)
        except HTTPException as exc:
            headers = dict(exc.headers or {})
            response = error_response(exc.status_code, "unauthorized", str(exc.detail), headers)
            await response(scope, receive, send)
            return
        manager: StreamableHTTPSessionManager = request.app.state.mcp_sessions
        await manager.handle_request(scope, receive, send)


def mount_mcp(app: FastAPI) -> None:
    """Add the streamable HTTP endpoint at ``/mcp`` (served while ``serving_mcp`` runs)."""
    app.router.routes.append(Route(PATH, endpoint=_Endpoint(), include_in_schema=False))


@contextlib.asynccontextmanager
async def serving_mcp(app: FastAPI) -> AsyncIterator[None]:
    """Run the MCP session manager for the api's lifespan.

    Stateless: every request carries the token and the session header, so any api
    process can answer it (no MCP session is pinned to one process).
    """
    manager = StreamableHTTPSessionManager(app=build_server(_http_caller), stateless=True)
    app.state.mcp_sessions = manager
    async with manager.run():
        yield


# ---- stdio --------------------------------------------------------------------------------


async def serve_stdio(services: Services, session_ref: str | None) -> None:
    """Serve MCP over stdin/stdout acting for ``session_ref`` until the client disconnects."""
    async_store = AsyncStore.from_url(
        services.settings.redis_url or "",
        services.store.ks,
        socket_keepalive=True,
        health_check_interval=25,
    )
    waiter = async_store.run_waiter()
    await waiter.start()

    async def wait(run_id: str, timeout_s: float) -> RunRecord | None:
        return await waiter.wait(run_id, timeout_s)

    caller = Caller(services=services, session_ref=session_ref, wait=wait)
    server = build_server(lambda _ctx: caller)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await waiter.stop()
        await async_store.aclose()
