"""``sessions_send``: send a message into another visible session, optionally wait for its reply.

Follows OpenClaw (reference §5.1 to §5.5) with SPEC §5's fixes: ``reply`` is the target
run's own final text (never a stale earlier message); a wait that times out leaves the
reply-back loop and the announce to run when the target finishes; waiting inside an agent
run parks that run instead of holding a worker. A synchronous send to one's own session is
refused (it would wait behind its own turn, OpenClaw PR #107267); fire-and-forget to
oneself is allowed.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.errors import StoreUnavailable, SwitchboardError
from switchboard.shared.flows import a2a_rules as rules
from switchboard.shared.flows.a2a_flow import advance, load_flow, new_flow
from switchboard.shared.flows.reply_back import send_allowed, step_after
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.gateway.resolve import display_key, resolve_label, resolve_session_ref
from switchboard.shared.policy.send_policy import SEND_BLOCKED
from switchboard.shared.policy.visibility import (
    a2a_allowed,
    a2a_denied_message,
    a2a_disabled_message,
    spawned_closure,
)
from switchboard.shared.store.runs import RunRecord
from switchboard.shared.store.sessions import SessionEntry
from switchboard.shared.tools import send_modes as modes
from switchboard.shared.tools.access import visibility_guard
from switchboard.shared.tools.args import read_int, read_number, read_string
from switchboard.shared.tools.registry import ToolContext, ToolSpec, WaitFor

DEFAULT_TIMEOUT_S = 30
MAX_TIMEOUT_S = 600
PENDING_ANNOUNCE = {"status": "pending", "mode": "announce"}
SANDBOX_LABEL_AGENT = "Sandboxed sessions_send label lookup is limited to this agent"
SANDBOX_NOT_VISIBLE = "Session not visible from this sandboxed agent session"
SELF_WAIT = (
    "sessions_send cannot wait for a reply from the current session: the message would "
    "queue behind this very turn and time out. Use timeoutSeconds: 0 to queue a message "
    "to yourself."
)
UNKNOWN_AGENT = 'Agent "{agent_id}" not found. Use agents_list to see the agents you can target.'
TIMEOUT_TEXT = (
    "No reply within {timeout}s: the message was delivered and the target run is still "
    "running; its reply will appear in sessions_history and the reply-back/announce flow "
    "continues when it finishes."
)

DESCRIPTION = (
    "Send a message into another visible session by sessionKey or label. Use this to "
    "delegate follow-up work to an existing session; waits for the target run and returns "
    "the updated assistant reply when available. timeoutSeconds (default 30, max 600) is "
    "how long to wait; 0 sends without waiting (fire-and-forget). mode: followup "
    "(default) starts a new turn; steer puts the message into the target's running turn "
    "(queued as its next turn when none runs); notify leaves a notification its next turn "
    "sees, starting no run; resume starts a new turn of a settled session (admission only)."
)

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sessionKey": {
            "type": "string",
            "description": "Target session: a key from sessions_list, main, or a sessionId.",
        },
        "label": {
            "type": "string",
            "minLength": 1,
            "maxLength": 512,
            "description": "Find the target by its label instead of sessionKey.",
        },
        "agentId": {
            "type": "string",
            "minLength": 1,
            "maxLength": 64,
            "description": "With label: look the label up among this agent's sessions.",
        },
        "message": {"type": "string", "description": "The message to send."},
        "mode": {
            "type": "string",
            "description": (
                "followup (default), steer, notify or resume; steer, notify and resume "
                "do not wait (timeoutSeconds 0)."
            ),
        },
        "timeoutSeconds": {
            "type": "number",
            "minimum": 0,
            "description": "Seconds to wait for the reply (default 30; 0 = do not wait).",
        },
    },
    "required": ["message"],
}


def handle(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Check the target, start its run, and answer now or raise ``WaitFor``."""
    message = read_string(args, "message", required=True) or ""
    raw_key = read_string(args, "sessionKey")
    label = read_string(args, "label")
    run_id = str(uuid.uuid4())
    mode = _mode(args)
    if mode is None:
        return _error(run_id, modes.BAD_MODE)
    timeout_s = (
        read_int(args, "timeoutSeconds", default=DEFAULT_TIMEOUT_S, lo=0, hi=MAX_TIMEOUT_S) or 0
    )
    if mode == "resume" and ((read_number(args, "timeoutSeconds") or 0) > 0 or args.get("watch")):
        return _error(run_id, modes.RESUME_WAITS)
    if mode != "followup":
        timeout_s = 0  # steer and resume answer admission; a notification starts nothing
    if raw_key and label:
        return _error(run_id, "Provide either sessionKey or label (not both).")
    if label:
        found = _resolve_label(ctx, label, read_string(args, "agentId"))
        if isinstance(found, dict):
            return {"runId": run_id, **found}
        raw_key = found
    if not raw_key:
        return _error(run_id, "Either sessionKey or label is required")
    try:
        target = resolve_session_ref(ctx.services, raw_key, requester_key=ctx.session_key)
    except StoreUnavailable:
        raise  # the store is away: retried, not an outcome
    except SwitchboardError as exc:
        return _error(run_id, exc.message)
    shown = display_key(ctx.services, target, ctx.agent_id)
    # The target's entry, read once for its send policy here and where its run starts.
    entry = ctx.services.store.sessions.get(target)
    refusal = _refusal(
        ctx, target, raw_key, entry, via_label=label is not None, waits=timeout_s > 0
    )
    if refusal is not None:
        return {"runId": run_id, **refusal, "sessionKey": shown}
    if mode == "followup":
        return _send(ctx, target, shown, message, timeout_s, entry)
    if entry is None:
        return _error(run_id, modes.MISSING_SESSION, sessionKey=shown)
    try:
        return modes.run_mode(ctx, mode, target, shown, message)
    except StoreUnavailable:
        raise  # the store is away: retried, not an outcome
    except SwitchboardError as exc:
        return _error(run_id, exc.message, sessionKey=shown)


def _mode(args: Mapping[str, Any]) -> str | None:
    """The send's mode (``followup`` when not given), or None when it names none."""
    raw = args.get("mode")
    if raw is None:
        return "followup"
    if not isinstance(raw, str):
        return None
    mode = raw.strip().lower() or "followup"
    return mode if mode in modes.MODES else None


def _error(run_id: str, error: str, **extra: Any) -> dict[str, Any]:
    return {"runId": run_id, "status": "error", "error": error, **extra}


def _forbidden(error: str) -> dict[str, Any]:
    return {"status": "forbidden", "error": error}


def _restricted(ctx: ToolContext) -> bool:
    """A sandboxed session limited to the sessions it spawned (reference §2.1, §2.4)."""
    if not ctx.sandboxed or sk.is_subagent_key(ctx.session_key):
        return False
    sandbox = ctx.services.config.sandbox_for(ctx.agent_id)
    return sandbox.session_tools_visibility == "spawned"


def _spawned(ctx: ToolContext) -> frozenset[str]:
    return spawned_closure(ctx.session_key, ctx.services.store.sessions.children)


def _resolve_label(ctx: ToolContext, label: str, agent_arg: str | None) -> str | dict[str, Any]:
    """The key carrying ``label``, or the early-exit answer (reference §5.2 step 2)."""
    restricted = _restricted(ctx)
    requested = sk.normalize_agent_id(agent_arg) if agent_arg else None
    if requested is not None and requested != ctx.agent_id:
        if restricted:
            return _forbidden(SANDBOX_LABEL_AGENT)
        config = ctx.services.config
        if not config.tools.agent_to_agent.enabled:
            return _forbidden(a2a_disabled_message("send"))
        if not a2a_allowed(config, ctx.agent_id, requested):
            return _forbidden(a2a_denied_message("send"))
        if config.agents.list and config.agent(requested) is None:  # agents are configured
            return {"status": "error", "error": UNKNOWN_AGENT.format(agent_id=requested)}
    try:
        key = resolve_label(ctx.services, label, requested)
    except StoreUnavailable:
        raise  # the store is away: retried, not an outcome
    except SwitchboardError as exc:
        if restricted:
            return _forbidden(f"{SANDBOX_NOT_VISIBLE}.")
        return {"status": "error", "error": exc.message or f"No session found with label: {label}"}
    if restricted and key != ctx.session_key and key not in _spawned(ctx):
        return _forbidden(f"{SANDBOX_NOT_VISIBLE}.")
    return key


def _refusal(
    ctx: ToolContext,
    target: str,
    raw_key: str,
    entry: SessionEntry | None,
    *,
    via_label: bool,
    waits: bool,
) -> dict[str, Any] | None:
    """Why this send may not happen (sandbox, visibility, self-wait, send policy), or None."""
    if (
        _restricted(ctx)
        and not via_label
        and target != ctx.session_key
        and not sk.looks_like_session_id(raw_key)
        and target not in _spawned(ctx)
    ):
        return _forbidden(f"{SANDBOX_NOT_VISIBLE}: {raw_key}")
    verdict = visibility_guard(ctx).check(target, "send")
    if not verdict.allowed:
        return _forbidden(verdict.error or "forbidden")
    if waits and target == ctx.session_key:
        return {"status": "error", "error": SELF_WAIT}
    if not send_allowed(ctx.services, target, entry=entry):
        return {"status": "error", "error": SEND_BLOCKED}
    return None


def _send(
    ctx: ToolContext,
    target: str,
    shown: str,
    message: str,
    timeout_s: int,
    entry: SessionEntry | None,
) -> dict[str, Any]:
    """Record the flow, start the target's run, then answer (or wait)."""
    svc = ctx.services
    max_turns = svc.config.session.agent_to_agent.max_ping_pong_turns
    requester = ctx.session_key or None
    # The flow is written by the primary run's start, in the same step.
    flow_id, flow_record = new_flow(
        svc,
        requester_key=requester,
        requester_channel=ctx.channel,
        target_key=target,
        target_display=shown,
        message=message,
        max_turns=max_turns,
        skip_reason=rules.ping_pong_skip_reason(requester, target, max_turns),
    )
    provenance = modes.provenance(ctx)
    try:
        started = start_run(
            svc,
            RunRequest(
                session_key=target,
                message=message,
                channel="webchat",
                extra_system_prompt=rules.message_context(requester, ctx.channel, shown),
                provenance=provenance,
                meta={"flowId": flow_id, "a2a": "primary"},
                on_end=step_after(flow_id, 0),
                entry=entry,
                link=(svc.store.ks.flow(flow_id), "run:0"),
                link_record=flow_record,
                watched=timeout_s > 0,  # the api waits for it (`WaitFor`)
            ),
        )
    except StoreUnavailable:
        raise  # the store is away: retried, not an outcome
    except SwitchboardError as exc:
        _abandon(ctx, flow_id)
        return _error(str(uuid.uuid4()), exc.message, sessionKey=shown)
    run_id = str(started["runId"])
    if timeout_s == 0:
        return {
            "runId": run_id,
            "status": "accepted",
            "sessionKey": shown,
            "delivery": dict(PENDING_ANNOUNCE),
            "flowId": flow_id,
        }
    context = {"runId": run_id, "sessionKey": shown, "flowId": flow_id, "timeoutS": timeout_s}
    raise WaitFor(run_id, float(timeout_s), context, acted=True)


def _abandon(ctx: ToolContext, flow_id: str) -> None:
    """End a flow whose primary run was recorded but could not be enqueued (a refused
    start records neither, so there is nothing to end)."""
    flow = load_flow(ctx.services, flow_id)
    if flow is not None:
        advance(
            ctx.services,
            flow,
            {"status": "done", "stopReason": "not_started", "announceStatus": "not_run"},
        )


def complete(
    ctx: ToolContext, context: Mapping[str, Any], target: RunRecord | None
) -> dict[str, Any]:
    """Turn the target run's outcome (or its absence at the deadline) into the result."""
    run_id = str(context.get("runId"))
    shown = context.get("sessionKey")
    flow = {"flowId": context["flowId"]} if context.get("flowId") else {}
    if target is None:
        return _error(run_id, "target run not found", sessionKey=shown, **flow)
    if not target.terminal:
        error = TIMEOUT_TEXT.format(timeout=context.get("timeoutS", DEFAULT_TIMEOUT_S))
        return {"runId": run_id, "status": "timeout", "error": error, "sessionKey": shown, **flow}
    if target.status == "ok":
        reply = rules.visible_reply(target.reply)
        if reply is None:  # nothing to pass on (silent, or a control token)
            return {
                "runId": run_id,
                "status": "no_reply",
                "sessionKey": shown,
                "message": modes.NO_REPLY,
                **flow,
            }
        out: dict[str, Any] = {"runId": run_id, "status": "ok", "reply": reply}
        return {**out, "sessionKey": shown, "delivery": dict(PENDING_ANNOUNCE), **flow}
    if target.status == "timeout":
        error = target.error or "agent timed out"
        return {"runId": run_id, "status": "timeout", "error": error, "sessionKey": shown, **flow}
    return _error(run_id, target.error or "agent error", sessionKey=shown, **flow)


SPEC = ToolSpec(
    name="sessions_send",
    description=DESCRIPTION,
    parameters=PARAMETERS,
    handler=handle,
    complete=complete,
    complete_is_pure=True,
)
