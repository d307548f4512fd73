"""MCP: the session tools for an MCP client acting as one session.

Two ways in, one server: streamable HTTP at ``/mcp`` on the api (bearer token; the session
comes from the ``x-switchboard-session-key`` header, default ``main``) and stdio
(``switchboard mcp --session-key K``). Tools are listed and run exactly as over
``/tools/invoke``: the same offer (sub-agent policy included), the same handlers, waiting
sends awaited on the RunWaiter. Contract outcomes (``status: error | forbidden | timeout``)
are the tool's JSON result; bad arguments and other refusals are MCP tool errors.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
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
from switchboard.api.tools import RunWait, app_run_wait, call_tool, tool_context
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


def build_server(caller_of: Callable[[Context], Caller]) -> Server[Any]:
    """The MCP server; ``caller_of`` tells each request's acting session."""

    async def acting(caller: Caller) -> ToolContext:
        return await run_in_threadpool(tool_context, caller.services, caller.session_ref)

    async def list_tools(
        ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            tctx = await acting(caller_of(ctx))
            offered = await run_in_threadpool(tools_for_session, tctx.services, tctx)
        except StoreUnavailable as exc:
            log.warning("redis unavailable: %s", exc.__cause__)
            raise MCPError(types.INTERNAL_ERROR, UNAVAILABLE) from None
        except SwitchboardError as exc:
            raise MCPError(types.INVALID_PARAMS, exc.message) from None
        tools = [
            types.Tool(name=s.name, description=s.description, input_schema=dict(s.parameters))
            for s in offered
        ]
        return types.ListToolsResult(tools=tools)

    async def call(ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            caller = caller_of(ctx)
            tctx = await acting(caller)
            result = await call_tool(tctx, params.name, params.arguments or {}, caller.wait)
        except StoreUnavailable as exc:
            log.warning("redis unavailable: %s", exc.__cause__)
            return _tool_error(UNAVAILABLE)
        except SwitchboardError as exc:
            return _tool_error(exc.message)
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
    return Caller(services=app.state.services, session_ref=ref, wait=app_run_wait(app))


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
