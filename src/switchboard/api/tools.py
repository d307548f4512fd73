"""`POST /tools/invoke`: OpenClaw's tool contract over HTTP, acting for one session."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.concurrency import run_in_threadpool

from switchboard.api.auth import require_token
from switchboard.api.body import parse_json_body, tool_body_schema
from switchboard.api.scopes import OWNER, AuditNote, Principal, audit_note, principal_of
from switchboard.shared import keys as sk
from switchboard.shared.errors import NotFound, StoreUnavailable
from switchboard.shared.gateway.resolve import resolve_session_ref
from switchboard.shared.services import Services
from switchboard.shared.store.runs import RunRecord
from switchboard.shared.store.waiter import RunWaiter
from switchboard.shared.tools.catalog import ALL_TOOLS
from switchboard.shared.tools.offer import tools_for_session
from switchboard.shared.tools.registry import ToolContext, ToolSpec, WaitFor

log = logging.getLogger("switchboard.api")

# How often a wait after a tool acted (`WaitFor.acted`) waits again while the store is away.
OUTAGE_RETRY_S = 0.5

router = APIRouter()

RunWait = Callable[[str, float], Awaitable[RunRecord | None]]


class ToolInvokeRequest(BaseModel):
    """A tool call acting for `sessionKey` (default: the default agent's main session)."""

    model_config = ConfigDict(extra="ignore")

    tool: StrictStr = Field(max_length=128)
    args: dict[str, Any] = Field(default_factory=dict)
    sessionKey: StrictStr | None = Field(default=None, max_length=512)


def tool_context(
    svc: Services,
    session_ref: str | None,
    principal: Principal = OWNER,
    note: AuditNote | None = None,
) -> ToolContext:
    """The context of a caller acting for ``session_ref`` (default: the main session; for
    a scoped token, its session or its agent's main), refused outside the token's scope."""
    key = resolve_session_ref(svc, principal.session_ref(session_ref), agent_id=principal.agent_id)
    if note is not None:
        note.session_key = key
    principal.check_session(key)
    agent_id = sk.agent_id_of(key)
    is_main = sk.session_kind(key, main_key=svc.config.session.main_key) == "main"
    entry = svc.store.sessions.get(key)
    return ToolContext(
        services=svc,
        session_key=key,
        agent_id=agent_id,
        channel=(entry.get("lastChannel") if entry else None) or "webchat",
        sandboxed=svc.config.is_sandboxed(agent_id, is_main),
        owner=principal.is_owner,
        spawn_depth=int((entry.get("spawnDepth") if entry else 0) or 0),
    )


@router.post(
    "/tools/invoke",
    dependencies=[Depends(require_token)],
    openapi_extra=tool_body_schema((spec.name, spec.parameters) for spec in ALL_TOOLS),
)
async def invoke(request: Request) -> dict[str, Any]:
    """Run one tool; contract outcomes (error, forbidden, timeout) come back as results."""
    body = await parse_json_body(request, ToolInvokeRequest)
    svc: Services = request.app.state.services
    principal, note = principal_of(request), audit_note(request)
    if note is not None:
        note.tool = body.tool
    since = asyncio.get_running_loop().time()
    # The caller's context, the tool lookup and the handler: one hop to a thread.
    ctx, spec, outcome = await run_in_threadpool(
        _start_as, svc, body.sessionKey, body.tool, body.args, principal, note
    )
    if isinstance(outcome, WaitFor) and (outcome.also or spec.ready is not None):
        wait = app_run_wait(request.app)
        target = await _waited(outcome, lambda w: wait_any(ctx, spec, w, wait))
        outcome = await _complete(ctx, spec, outcome, target)
    elif isinstance(outcome, WaitFor):
        # The run was started by this request, after `since`: the waiter needs no first
        # read (a wait again after an outage reads it).
        first = outcome
        waiter: RunWaiter = request.app.state.waiter

        def waiting(w: WaitFor) -> Awaitable[RunRecord | None]:
            fetch = request.app.state.fetch_run
            since_first = since if w is first else None
            return waiter.wait(w.target_run_id, w.timeout_s, fetch, since=since_first)

        outcome = await _complete(ctx, spec, outcome, await _waited(outcome, waiting))
    if note is not None:
        note.outcome = tool_status(outcome)
    return {"ok": True, "result": outcome}


def tool_status(result: Mapping[str, Any]) -> str:
    """A tool result's own status (`ok`, `forbidden`, `error`, `timeout`, …), else `ok`."""
    status = result.get("status")
    return status if isinstance(status, str) and status else "ok"


def app_run_wait(app: FastAPI) -> RunWait:
    """Waits on the api's RunWaiter for a run to end (or the timeout to pass)."""

    async def wait(run_id: str, timeout_s: float) -> RunRecord | None:
        record: RunRecord | None = await app.state.waiter.wait(
            run_id, timeout_s, app.state.fetch_run
        )
        return record

    return wait


async def call_tool(
    ctx: ToolContext, name: str, args: Mapping[str, Any], wait: RunWait
) -> dict[str, Any]:
    """Run a tool offered to ``ctx``'s session; a ``WaitFor`` is awaited without blocking.

    Unknown or not-offered tools are ``NotFound``; bad arguments raise ``InvalidInput``.
    """
    spec, outcome = await run_in_threadpool(_start, ctx, name, args)
    if isinstance(outcome, WaitFor):
        target = await _waited(outcome, lambda w: wait_any(ctx, spec, w, wait))
        outcome = await _complete(ctx, spec, outcome, target)
    return outcome


async def _waited(
    wait_for: WaitFor, wait: Callable[[WaitFor], Awaitable[RunRecord | None]]
) -> RunRecord | None:
    """What ``wait`` answered for ``wait_for``. A wait whose store is away raises
    `StoreUnavailable` (a 503 the client retries), unless the tool already acted
    (`WaitFor.acted`: a send was made), where a retry would act twice: that wait rides the
    outage out, waiting again every `OUTAGE_RETRY_S` for what is left of its timeout, and
    one the outage outlasts is answered as a wait that saw no end (`RunRecord.unseen`), as
    its tool answers a timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, wait_for.timeout_s)
    current = wait_for
    while True:
        try:
            return await wait(current)
        except StoreUnavailable as exc:
            if not wait_for.acted:
                raise
            left = deadline - loop.time()
            if left <= 0:
                log.warning(
                    "run %s: the store was away until the wait's end (%s); answered as a timeout",
                    wait_for.target_run_id,
                    exc.fields.get("detail", exc.message),
                )
                return RunRecord.unseen(wait_for.target_run_id)
            await asyncio.sleep(min(OUTAGE_RETRY_S, left))
            current = wait_for.remaining(max(0.0, deadline - loop.time()))


async def wait_any(
    ctx: ToolContext, spec: ToolSpec, wait_for: WaitFor, wait: RunWait
) -> RunRecord | None:
    """Wait until one of a `WaitFor`'s runs ends (and the tool's `ready` agrees) or its
    timeout passes: the run that ended, else the first run as it stands."""
    if not wait_for.also and spec.ready is None:
        return await wait(wait_for.target_run_id, wait_for.timeout_s)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, wait_for.timeout_s)
    pending = list(wait_for.target_run_ids)
    while True:
        remaining = max(0.0, deadline - loop.time())
        tasks = {run_id: asyncio.ensure_future(wait(run_id, remaining)) for run_id in pending}
        try:
            done, _ = await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks.values():
                task.cancel()
        ended = {r: t.result() for r, t in tasks.items() if t in done and _ended(t.result())}
        if not ended:
            return next(iter(done)).result()  # the timeout passed
        if spec.ready is None or await run_in_threadpool(spec.ready, ctx, wait_for.context):
            return next(iter(ended.values()))
        pending = [r for r in pending if r not in ended]
        if not pending:  # what ended is not enough yet (a yielded child): look again
            while loop.time() < deadline:
                await asyncio.sleep(min(_READY_POLL_S, deadline - loop.time()))
                if await run_in_threadpool(spec.ready, ctx, wait_for.context):
                    break
        if loop.time() >= deadline or not pending:
            return next(iter(ended.values()))


# How often a wait whose runs have all ended asks the tool again whether it can answer.
_READY_POLL_S = 1.0


def _ended(rec: RunRecord | None) -> bool:
    return rec is None or rec.terminal


def _start_as(
    svc: Services,
    session_ref: str | None,
    name: str,
    args: Mapping[str, Any],
    principal: Principal,
    note: AuditNote | None,
) -> tuple[ToolContext, ToolSpec, dict[str, Any] | WaitFor]:
    ctx = tool_context(svc, session_ref, principal, note)
    principal.check_tool(name)
    return (ctx, *_start(ctx, name, args))


def _start(
    ctx: ToolContext, name: str, args: Mapping[str, Any]
) -> tuple[ToolSpec, dict[str, Any] | WaitFor]:
    """The offered tool's result, or the run it must wait for."""
    spec = next((s for s in tools_for_session(ctx.services, ctx) if s.name == name), None)
    if spec is None:
        raise NotFound(f"Tool not available: {name}", field="tool")
    try:
        return spec, spec.handler(ctx, dict(args))
    except WaitFor as wait_for:
        if spec.complete is None:
            raise
        return spec, wait_for


async def _complete(
    ctx: ToolContext, spec: ToolSpec, wait_for: WaitFor, target: RunRecord | None
) -> dict[str, Any]:
    assert spec.complete is not None
    if spec.complete_is_pure:
        return spec.complete(ctx, wait_for.context, target)
    return await run_in_threadpool(spec.complete, ctx, wait_for.context, target)
