"""``sessions_send`` modes other than ``followup`` (OpenClaw 2026.9.6): ``steer`` into the
target's turn in flight, ``notify`` its next turn, ``resume`` its settled task.

None of them waits (``timeoutSeconds`` is 0 for them) and none starts a reply-back flow.
``steer`` appends the message to the target's steer inbox while a run holds its lane (the
run takes it at its next step: `runtime.steering`) and queues it as the next turn when none
does. ``notify`` leaves a notification the target's next turn sees (its first claim moves
it into the transcript) and starts no run. ``resume`` starts a new turn of a session whose
last turn has settled and answers admission only.
"""

from __future__ import annotations

import uuid
from typing import Any

from switchboard.shared.flows import a2a_rules as rules
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.store.runs import now_ms
from switchboard.shared.tools.registry import ToolContext

MODES = ("followup", "steer", "notify", "resume")
# Looks for the run in flight when steering (its lane may pass on between two reads).
STEER_TRIES = 2
BAD_MODE = "mode must be notify, steer, followup, or resume"
MISSING_SESSION = (
    "Cannot notify, steer, or resume a missing session. Use mode=followup to start a new turn."
)
RESUME_WAITS = (
    "mode=resume returns admission only; omit watch and timeoutSeconds or set "
    "timeoutSeconds=0. The task owner delivers completion."
)
RESUME_BUSY = (
    "Cannot resume a session whose turn is still in flight (run {run_id}). Use mode=steer "
    "to reach the running turn."
)
NO_REPLY = "No visible reply or pending announcement. Continue or retry if needed."


def provenance(ctx: ToolContext, mode: str | None = None) -> dict[str, Any]:
    """A message's inter-session provenance: the tool, the sending session and channel."""
    out: dict[str, Any] = {"kind": "inter_session", "sourceTool": "sessions_send"}
    if ctx.session_key:
        out["sourceSessionKey"] = ctx.session_key
    if ctx.channel:
        out["sourceChannel"] = ctx.channel
    if mode is not None:
        out["mode"] = mode
    return out


def run_mode(ctx: ToolContext, mode: str, target: str, shown: str, message: str) -> dict[str, Any]:
    """Carry out ``steer``, ``notify`` or ``resume`` on an existing session."""
    if mode == "steer":
        return steer(ctx, target, shown, message)
    if mode == "notify":
        return notify(ctx, target, shown, message)
    return resume(ctx, target, shown, message)


def steer(ctx: ToolContext, target: str, shown: str, message: str) -> dict[str, Any]:
    """Into the run holding the target's lane (``steered``), else its next turn (``queued``)."""
    svc = ctx.services
    steered = {
        "role": "user",
        "content": message,
        "timestamp": now_ms(),
        "provenance": provenance(ctx, "steer"),
    }
    for _ in range(STEER_TRIES):  # the lane may pass to the next run between the reads
        holder = svc.store.runs.lane_holder(target)
        if holder is None:
            break
        if svc.store.steering.steer(target, holder, steered):
            return {
                "status": "accepted",
                "runId": holder,
                "sessionKey": shown,
                "targetDisposition": "steered",
            }
    run_id = _start(ctx, target, shown, message, "steer")
    return {
        "status": "accepted",
        "runId": run_id,
        "sessionKey": shown,
        "targetDisposition": "queued",
    }


def notify(ctx: ToolContext, target: str, shown: str, message: str) -> dict[str, Any]:
    """A notification for the target's next turn; no run starts."""
    notification_id = str(uuid.uuid4())
    notice = {
        "role": "user",
        "content": message,
        "timestamp": now_ms(),
        "provenance": {**provenance(ctx, "notify"), "notificationId": notification_id},
    }
    if not ctx.services.store.steering.notify(target, notice):
        return {"status": "error", "error": MISSING_SESSION, "sessionKey": shown}
    return {
        "status": "queued",
        "sessionKey": shown,
        "notificationId": notification_id,
        "runStarted": False,
    }


def resume(ctx: ToolContext, target: str, shown: str, message: str) -> dict[str, Any]:
    """A new turn of a settled session: admission only."""
    svc = ctx.services
    holder = svc.store.runs.lane_holder(target)
    if holder is not None:
        return {"status": "error", "error": RESUME_BUSY.format(run_id=holder), "sessionKey": shown}
    entry = svc.store.sessions.get(target)
    settled = str(entry.get("lastRunId") or "") if entry is not None else ""
    run_id = _start(ctx, target, shown, message, "resume")
    return {
        "status": "accepted",
        "mode": "resume",
        "runId": run_id,
        "taskRunId": settled or run_id,
        "sessionKey": shown,
        "completion": "task",
    }


def _start(ctx: ToolContext, target: str, shown: str, message: str, mode: str) -> str:
    """Start a turn of the target with ``message`` (no reply-back flow); its run id."""
    requester = ctx.session_key or None
    started = start_run(
        ctx.services,
        RunRequest(
            session_key=target,
            message=message,
            channel="webchat",
            extra_system_prompt=rules.message_context(requester, ctx.channel, shown),
            provenance=provenance(ctx, mode),
            meta={"sendMode": mode},
        ),
    )
    return str(started["runId"])
