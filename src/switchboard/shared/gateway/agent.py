"""Gateway methods that start and await runs: `agent`, `chat.send`, `agent.wait`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import EllipsisType
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.errors import Forbidden, InvalidInput, NotFound
from switchboard.shared.gateway.resolve import display_key, resolve_session_ref
from switchboard.shared.policy.send_policy import (
    SEND_BLOCKED,
    SendCommand,
    parse_send_command,
    session_send_decision,
)
from switchboard.shared.queue import enqueue_recorded
from switchboard.shared.runtime.models import validate_model_ref
from switchboard.shared.services import Services
from switchboard.shared.store.runs import (
    Claim,
    LinkAdvance,
    LinkRecord,
    NewRun,
    RunRecord,
    now_ms,
)
from switchboard.shared.store.sessions import SessionEntry


@dataclass(frozen=True)
class RunRequest:
    """Everything that starts a run in a session."""

    session_key: str
    message: str
    channel: str | None = None
    to: str | None = None
    account_id: str | None = None
    thread_id: str | None = None
    deliver: bool = False
    idempotency_key: str | None = None
    extra_system_prompt: str | None = None
    provenance: Mapping[str, Any] | None = None
    timeout_s: float | None = None
    model: str | None = None
    label: str | None = None
    kind: str = "agent"
    meta: Mapping[str, Any] = field(default_factory=dict)
    on_end: Mapping[str, Any] | None = None
    # True for callers holding the gateway token (they may use `/send on|off|inherit`).
    owner: bool = False
    # The session's entry as the caller read it in the same step (None: no entry), so the
    # send policy is judged without reading it again; ``...``: not read.
    entry: SessionEntry | EllipsisType | None = ...
    # (hash key, field) naming the run once recorded, unless set (see `NewRun.link`).
    link: tuple[str, str] | None = None
    # A record created at the link's hash with the run (see `NewRun.link_record`); when
    # no run is recorded (a refused start), none is written.
    link_record: LinkRecord | None = None
    # The caller waits for the run's end (see `NewRun.watched`).
    watched: bool = False
    # A compare-and-set on the link's hash made in the step that records the run; when the
    # hash has moved on, nothing is recorded and `LinkMoved` is raised (`NewRun.link_advance`).
    link_advance: LinkAdvance | None = None
    # A request's client-side tools and tool choice (`runtime.client_tools`), checked by
    # the caller; with ``tool_results`` (the client's results for the calls the session's
    # last run ended on) the run has no user message (``message`` is left empty).
    client_tools: Sequence[Mapping[str, Any]] = ()
    tool_choice: Any = None
    tool_results: Sequence[Mapping[str, Any]] = ()


def start_run(svc: Services, req: RunRequest) -> dict[str, Any]:
    """Record the user message's run, take or queue for the session lane, enqueue it.

    ``req.session_key`` must already be canonical. Returns ``{runId, status: accepted}``
    at once; the run executes on a worker.
    """
    text = req.message.strip()
    if not text and not req.tool_results:
        raise InvalidInput("message required", field="message")
    key = req.session_key
    command = parse_send_command(text) if text else None
    if command is not None:
        return _apply_send_command(svc, req, command)
    if req.model:
        validate_model_ref(req.model, svc.config.models.providers)
    check_send_policy(svc, key, channel=req.channel, entry=req.entry)
    run_id = svc.store.ks.new_id_beside(key)  # in the session's slot group
    message: dict[str, Any] | None = None
    if text:
        message = {"role": "user", "content": text, "timestamp": now_ms()}
        if req.provenance:
            message["provenance"] = dict(req.provenance)
    # Runs are capped at an hour (the broker visibility timeout is sized above it).
    timeout_s = min(req.timeout_s, 3600.0) if req.timeout_s and req.timeout_s > 0 else None
    run = NewRun(
        run_id=run_id,
        session_key=key,
        message=message,
        timeout_s=timeout_s or float(svc.config.runs.timeout_seconds),
        extra_system_prompt=req.extra_system_prompt,
        model=req.model,
        channel=req.channel,
        kind=req.kind,
        meta=req.meta,
        on_end=req.on_end,
        link=req.link,
        link_record=req.link_record,
        watched=req.watched,
        link_advance=req.link_advance,
        client_tools=req.client_tools,
        tool_choice=req.tool_choice,
        tool_results=req.tool_results,
    )
    existing: str | None = None
    if req.label or _delivery_route(req):
        # A label may be refused (labels are unique) and a route patches the entry:
        # both before the run is recorded, in separate steps.
        if req.link and req.link_advance:
            svc.store.runs.advance_link(req.link[0], req.link_advance)
        _ensure_session(svc, req)
        if req.link and req.link_record:
            svc.store.runs.write_link_record(req.link[0], req.link_record)
        if req.idempotency_key:
            named = svc.store.runs.remember_idempotency(key, req.idempotency_key, run_id)
            existing = named if named != run_id else None
        took_lane = existing is None and svc.store.runs.submit(run)
        if req.link:
            svc.store.runs.name_link(req.link, existing or run_id)
    else:
        # A run a task will execute itself (an announce, a reply-back round) is claimed in
        # its start step: one round trip, not two.
        started = svc.store.runs.start(
            run,
            on_create=_on_create(req),
            idempotency_key=req.idempotency_key,
            claim_history=svc.inline.claim_history() if svc.inline is not None else None,
        )
        existing, took_lane = started.existing_run_id, started.took_lane
        if isinstance(started.claim, Claim):
            if started.claim.first:
                svc.metrics.run_started()
            if svc.inline is not None and svc.inline.take_claimed(run_id, key, started.claim):
                took_lane = False  # taken, claimed: nothing to enqueue
            else:  # not taken after all: queued again for whoever takes its message
                svc.store.runs.requeue(run_id, started.claim.attempt)
    if existing is not None:
        return {"runId": existing, "status": "accepted", "deduplicated": True}
    if took_lane:
        enqueue_recorded(lambda: svc.queue.enqueue_run(run_id, key))
    return {"runId": run_id, "status": "accepted", "acceptedAt": now_ms()}


class SendBlocked(Forbidden):
    """The target session's send policy denies starting a run or delivering to it."""


def check_send_policy(
    svc: Services,
    key: str,
    *,
    channel: str | None = None,
    entry: SessionEntry | EllipsisType | None = ...,
) -> None:
    """Raise SendBlocked when the session's send policy (override, rules) says deny.

    Rules match the target session's own channel; the request's ``channel`` counts only
    for a session that does not exist yet (it becomes that session's channel). ``entry``
    is the session's entry when the caller has just read it (``...``: read it here)."""
    if isinstance(entry, EllipsisType):
        entry = svc.store.sessions.get(key)
    fields = entry.fields if entry is not None else None
    if session_send_decision(svc.config, key, fields, channel=channel) == "deny":
        raise SendBlocked(SEND_BLOCKED, field="sessionKey")


def _apply_send_command(svc: Services, req: RunRequest, command: SendCommand) -> dict[str, Any]:
    """The owner's standalone `/send on|off|inherit`: set the override, start no run."""
    if not req.owner:
        raise Forbidden("/send is only accepted from the session owner", field="message")
    if not command.valid:
        return {"status": "error", "error": command.reply, "reply": command.reply}
    svc.store.sessions.ensure(req.session_key)
    svc.store.sessions.patch(req.session_key, {"sendPolicy": command.value})
    return {"status": "ok", "command": "send", "sendPolicy": command.value, "reply": command.reply}


def _on_create(req: RunRequest) -> dict[str, Any]:
    """The fields a session entry created by this request starts with."""
    on_create: dict[str, Any] = {"chatType": sk.chat_type(req.session_key)}
    if req.label:
        on_create["label"] = req.label
    channel = (req.channel or "").strip().lower() or None
    if channel:
        on_create["channel"] = channel
    return on_create


def _delivery_route(req: RunRequest) -> bool:
    """True when the request names a route (channel and `to`) the entry may record."""
    return bool((req.channel or "").strip() and req.to)


def _ensure_session(svc: Services, req: RunRequest) -> None:
    key = req.session_key
    channel = (req.channel or "").strip().lower() or None
    svc.store.sessions.ensure(key, on_create=_on_create(req))
    entry = svc.store.sessions.get(key)
    if entry is not None and channel and req.to and not entry.get("deliveryContext"):
        ctx = {"channel": channel, "to": req.to}
        if req.account_id:
            ctx["accountId"] = req.account_id
        if req.thread_id:
            ctx["threadId"] = req.thread_id
        svc.store.sessions.patch(
            key,
            {
                "deliveryContext": ctx,
                "lastChannel": channel,
                "lastTo": req.to,
                "lastAccountId": req.account_id,
            },
        )


def agent_method(svc: Services, params: Mapping[str, Any]) -> dict[str, Any]:
    """Gateway `agent`: start a run in a session."""
    agent_id = params.get("agentId")
    key = resolve_session_ref(svc, params.get("sessionKey"), agent_id=agent_id)
    if agent_id and sk.agent_id_of(key) != agent_id:
        raise InvalidInput(
            f'invalid agent params: agent "{agent_id}" does not match session key agent '
            f'"{sk.agent_id_of(key)}"',
            field="agentId",
        )
    provenance = params.get("inputProvenance") or {"kind": "external_user"}
    if params.get("channel") and "sourceChannel" not in provenance:
        provenance = {**provenance, "sourceChannel": params["channel"]}
    result = start_run(
        svc,
        RunRequest(
            session_key=key,
            message=params["message"],
            channel=params.get("channel"),
            to=params.get("to"),
            account_id=params.get("accountId"),
            thread_id=params.get("threadId"),
            deliver=bool(params.get("deliver", False)),
            idempotency_key=params.get("idempotencyKey"),
            extra_system_prompt=params.get("extraSystemPrompt"),
            provenance=provenance,
            timeout_s=params.get("timeout"),
            label=params.get("label"),
            owner=True,
        ),
    )
    result["sessionKey"] = display_key(svc, key)
    return result


def chat_send_method(svc: Services, params: Mapping[str, Any]) -> dict[str, Any]:
    """Gateway `chat.send`: a webchat message into a session (starts a run)."""
    key = resolve_session_ref(svc, params.get("sessionKey"))
    result = start_run(
        svc,
        RunRequest(
            session_key=key,
            message=params["message"],
            channel="webchat",
            deliver=bool(params.get("deliver", False)),
            idempotency_key=params.get("idempotencyKey"),
            provenance={"kind": "external_user", "sourceChannel": "webchat"},
            owner=True,
        ),
    )
    result["sessionKey"] = display_key(svc, key)
    return result


FetchRun = Callable[[str], Awaitable[RunRecord | None]]
WaitRun = Callable[[str, float, FetchRun], Awaitable[RunRecord | None]]


async def agent_wait_method(
    params: Mapping[str, Any], *, wait: WaitRun, fetch: FetchRun
) -> dict[str, Any]:
    """Gateway `agent.wait`: the run's outcome, waiting up to ``timeoutMs`` (default 30 s)."""
    run_id = str(params["runId"])
    timeout_ms = params.get("timeoutMs")
    timeout_s = 30.0 if timeout_ms is None else max(0.0, float(timeout_ms) / 1000)
    rec = await wait(run_id, timeout_s, fetch)
    if rec is None:
        raise NotFound(f"unknown runId: {run_id}", field="runId")
    return rec.outcome()
