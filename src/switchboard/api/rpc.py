"""`POST /rpc`: the gateway methods, each validated by its params model then dispatched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.concurrency import run_in_threadpool

from switchboard.api.auth import require_token
from switchboard.api.body import parse_json_body, rpc_body_schema
from switchboard.shared.errors import NotFound
from switchboard.shared.gateway import agent as agent_methods
from switchboard.shared.gateway import params as p
from switchboard.shared.gateway import sessions as session_methods
from switchboard.shared.services import Services

SyncMethod = Callable[[Services, dict[str, Any]], dict[str, Any]]

SYNC_METHODS: dict[str, tuple[type[p._Params], SyncMethod]] = {
    "agent": (p.AgentParams, agent_methods.agent_method),
    "chat.send": (p.ChatSendParams, agent_methods.chat_send_method),
    "chat.history": (p.ChatHistoryParams, session_methods.chat_history_method),
    "sessions.list": (p.SessionsListParams, session_methods.sessions_list_method),
    "sessions.resolve": (p.SessionsResolveParams, session_methods.sessions_resolve_method),
    "sessions.patch": (p.SessionsPatchParams, session_methods.sessions_patch_method),
    "sessions.delete": (p.SessionsDeleteParams, session_methods.sessions_delete_method),
    "flows.get": (p.FlowsGetParams, session_methods.flows_get_method),
    "flows.list": (p.FlowsListParams, session_methods.flows_list_method),
    "deliveries.list": (p.DeliveriesListParams, session_methods.deliveries_list_method),
}
METHODS = sorted([*SYNC_METHODS, "agent.wait"])


class RpcRequest(BaseModel):
    """A gateway call."""

    model_config = ConfigDict(extra="ignore")

    method: StrictStr = Field(max_length=128, description=f"One of: {', '.join(METHODS)}")
    params: dict[str, Any] | None = None
    id: StrictStr | int | None = None


router = APIRouter()


@router.post(
    "/rpc",
    dependencies=[Depends(require_token)],
    openapi_extra=rpc_body_schema(
        {name: model for name, (model, _) in SYNC_METHODS.items()}
        | {"agent.wait": p.AgentWaitParams}
    ),
)
async def rpc(request: Request) -> dict[str, Any]:
    """Call a gateway method; the answer is the method's result object."""
    body = await parse_json_body(request, RpcRequest)
    svc: Services = request.app.state.services
    if body.method == "agent.wait":
        params = p.parse_params(p.AgentWaitParams, body.params)
        return await agent_methods.agent_wait_method(
            params, wait=request.app.state.waiter.wait, fetch=request.app.state.fetch_run
        )
    entry = SYNC_METHODS.get(body.method)
    if entry is None:
        raise NotFound(f"unknown method: {body.method}", field="method")
    model, fn = entry
    params = p.parse_params(model, body.params)
    return await run_in_threadpool(fn, svc, params)
