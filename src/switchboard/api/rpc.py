"""`POST /rpc`: the gateway methods, each validated by its params model then dispatched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.concurrency import run_in_threadpool

from switchboard.api.auth import require_token
from switchboard.api.body import parse_json_body, rpc_body_schema
from switchboard.api.scopes import AuditNote, Principal, audit_note, principal_of
from switchboard.shared.errors import NotFound
from switchboard.shared.flows import a2a_flow
from switchboard.shared.gateway import agent as agent_methods
from switchboard.shared.gateway import params as p
from switchboard.shared.gateway import sessions as session_methods
from switchboard.shared.gateway.resolve import resolve_session_ref
from switchboard.shared.policy.send_policy import parse_send_command
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
    "flows.get": (p.FlowsGetParams, a2a_flow.flows_get_method),
    "flows.list": (p.FlowsListParams, a2a_flow.flows_list_method),
    "deliveries.list": (p.DeliveriesListParams, session_methods.deliveries_list_method),
}
METHODS = sorted([*SYNC_METHODS, "agent.wait"])
# The methods a scoped token may call, each acting as the session its params name (the
# others read or change sessions at large: owner only). `agent.wait` is checked on the run.
SCOPED_METHODS = frozenset(
    {"agent", "chat.send", "chat.history", "flows.list", "deliveries.list", "agent.wait"}
)
# Of those, the ones that start a run (refused to a token limited to some tools).
RUN_METHODS = frozenset({"agent", "chat.send"})


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
    principal, note = principal_of(request), audit_note(request)
    if note is not None:
        note.tool = body.method
    if body.method == "agent.wait":
        params = p.parse_params(p.AgentWaitParams, body.params)
        if not principal.is_owner:
            await _check_run(request, principal, note, str(params["runId"]))
        return await agent_methods.agent_wait_method(
            params, wait=request.app.state.waiter.wait, fetch=request.app.state.fetch_run
        )
    entry = SYNC_METHODS.get(body.method)
    if entry is None:
        raise NotFound(f"unknown method: {body.method}", field="method")
    model, fn = entry
    params = p.parse_params(model, body.params)
    if not principal.is_owner:
        params = await run_in_threadpool(_scoped_params, svc, principal, note, body.method, params)
    return await run_in_threadpool(fn, svc, params)


def _scoped_params(
    svc: Services,
    principal: Principal,
    note: AuditNote | None,
    method: str,
    params: dict[str, Any],
) -> dict[str, Any]:
    """A scoped token's params with the session they act as resolved (its agent's by
    default) and checked against its scope; other methods are owner only."""
    if method not in SCOPED_METHODS:
        principal.owner_only(f"the method {method!r}")
    if method in RUN_METHODS:
        principal.check_may_start_runs()
        if parse_send_command(str(params.get("message", ""))) is not None:
            principal.owner_only("/send")
    agent_id = params.get("agentId") or principal.agent_id
    key = resolve_session_ref(
        svc, principal.session_ref(params.get("sessionKey")), agent_id=agent_id
    )
    if note is not None:
        note.session_key = key
    principal.check_session(key)
    return {**params, "sessionKey": key}


async def _check_run(
    request: Request, principal: Principal, note: AuditNote | None, run_id: str
) -> None:
    """Refuse waiting on a run unknown or of a session outside the token's scope, alike
    (the refusal names no session: which runs exist elsewhere is not told)."""
    run = await request.app.state.fetch_run(run_id)
    if note is not None and run is not None:
        note.session_key = run.session_key
    if run is None or not principal.sees(run.session_key):
        raise NotFound(f"unknown runId: {run_id}", field="runId")
