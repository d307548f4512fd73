"""`POST /tools/invoke`: OpenClaw's tool contract over HTTP, acting for one session."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.concurrency import run_in_threadpool

from switchboard.api.auth import require_token
from switchboard.api.body import json_body_schema, parse_json_body
from switchboard.shared import keys as sk
from switchboard.shared.errors import NotFound
from switchboard.shared.gateway.resolve import resolve_session_ref
from switchboard.shared.services import Services
from switchboard.shared.tools.offer import tools_for_session
from switchboard.shared.tools.registry import ToolContext, WaitFor

router = APIRouter()


class ToolInvokeRequest(BaseModel):
    """A tool call acting for `sessionKey` (default: the default agent's main session)."""

    model_config = ConfigDict(extra="ignore")

    tool: StrictStr = Field(max_length=128)
    args: dict[str, Any] = Field(default_factory=dict)
    sessionKey: StrictStr | None = Field(default=None, max_length=512)


def _context(svc: Services, session_ref: str | None) -> ToolContext:
    key = resolve_session_ref(svc, session_ref)
    agent_id = sk.agent_id_of(key)
    is_main = sk.session_kind(key, main_key=svc.config.session.main_key) == "main"
    entry = svc.store.sessions.get(key)
    return ToolContext(
        services=svc,
        session_key=key,
        agent_id=agent_id,
        channel=(entry.get("lastChannel") if entry else None) or "webchat",
        sandboxed=svc.config.is_sandboxed(agent_id, is_main),
        owner=True,
        spawn_depth=int((entry.get("spawnDepth") if entry else 0) or 0),
    )


@router.post(
    "/tools/invoke",
    dependencies=[Depends(require_token)],
    openapi_extra=json_body_schema(ToolInvokeRequest),
)
async def invoke(request: Request) -> dict[str, Any]:
    """Run one tool; contract outcomes (error, forbidden, timeout) come back as results."""
    body = await parse_json_body(request, ToolInvokeRequest)
    svc: Services = request.app.state.services
    ctx = await run_in_threadpool(_context, svc, body.sessionKey)
    offered = await run_in_threadpool(tools_for_session, svc, ctx)
    spec = next((s for s in offered if s.name == body.tool), None)
    if spec is None:
        raise NotFound(f"Tool not available: {body.tool}", field="tool")
    try:
        result = await run_in_threadpool(spec.handler, ctx, dict(body.args))
    except WaitFor as wait:
        target = await request.app.state.waiter.wait(
            wait.target_run_id, wait.timeout_s, request.app.state.fetch_run
        )
        if spec.complete is None:
            raise
        result = await run_in_threadpool(spec.complete, ctx, wait.context, target)
    return {"ok": True, "result": result}
