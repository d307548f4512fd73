"""`sessions_yield`: end the current turn; the pending children's results arrive as the next
message (OpenClaw's tool, reference §5.1).

In an agent run the call ends the run (`EndTurn`): it ends ``ok`` with the run record's
``yielded`` flag set and no reply beyond what the model said with the call, and the same
end step marks the session yielded (``yieldedAt``, ``yieldedRunId``, ``yieldMessage`` on its
entry). Over ``/tools/invoke`` there is no turn to end: the session is marked yielded
(only if a child is pending, checked in the same step). Either way the announces of its
children then start its next run, batched (``flows/yield_wake.py``).

Refused (status ``error``, OpenClaw 2026.9.6's text) when nothing the session spawned is
still pending with a completion to announce (collectors, ``collect: true``, are drained
with ``agents_wait``; ``expectsCompletionMessage: false`` children announce nothing),
unless ``waitFor: "message"``: then the turn ends and the next incoming message (a
parent's ``sessions_send``) starts the next one. A session already yielded on pending
children answers ``already_pending``. The result is ``{status: "yielded",
acknowledgment?}``; ``acknowledgment`` is also the yielding run's visible reply.

An orchestrator sub-agent may yield too (leaves, which spawn nothing, are not offered the
tool): its run is paused, not complete. Its requester gets no completion yet; the wake run
carries the yielded run's follow-up, so the requester hears from the run that finally
answers without yielding.
"""

from __future__ import annotations

from typing import Any

from switchboard.shared.runtime.agent_loop import EndTurn
from switchboard.shared.store.runs import now_ms
from switchboard.shared.tools.args import read_string
from switchboard.shared.tools.registry import ToolContext, ToolSpec

DEFAULT_MESSAGE = "Turn yielded."
NOTHING_PENDING = (
    "No pending child completion is owned by this turn. If the assigned work is complete, "
    "return its result normally. An unfinished subagent waiting for an incoming "
    'continuation must explicitly set waitFor: "message".'
)
ALREADY_PENDING = (
    "A yield is already waiting for this session's pending children; their results arrive "
    "as the next message."
)
BAD_WAIT_FOR = 'waitFor must be "message" or omitted.'


def _error(text: str) -> dict[str, Any]:
    return {"status": "error", "error": text}


def awaited_children(ctx: ToolContext, session_key: str) -> list[str]:
    """The session's pending children whose completion comes back as an announce."""
    store = ctx.services.store
    kids = store.spawns.active_children(session_key)
    if not kids:
        return []
    entries = store.sessions.get_many(kids)
    spawn_ids = [str(e.get("spawnId") or "") if e is not None else "" for e in entries]
    known = [sid for sid in spawn_ids if sid]
    spawns = dict(zip(known, store.spawns.get_many(known), strict=True))
    out = []
    for kid, sid in zip(kids, spawn_ids, strict=True):
        spawn = spawns.get(sid)
        if spawn is not None and (
            spawn.get("collect") or spawn.get("expectsCompletionMessage") == "0"
        ):
            continue
        out.append(kid)
    return out


def _sessions_yield(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    message = read_string(args, "message") or DEFAULT_MESSAGE
    acknowledgment = read_string(args, "acknowledgment")
    wait_for = read_string(args, "waitFor")
    if wait_for is not None and wait_for != "message":
        return _error(BAD_WAIT_FOR)
    store = ctx.services.store
    children = awaited_children(ctx, ctx.session_key)
    if children and store.yields.is_yielded(ctx.session_key):
        return {
            "status": "already_pending",
            "message": ALREADY_PENDING,
            "pendingChildren": len(children),
        }
    result: dict[str, Any] = {"status": "yielded"}
    if acknowledgment is not None:
        result["acknowledgment"] = acknowledgment
    if not children:
        if wait_for != "message":
            return _error(NOTHING_PENDING)
        # Nothing to wake it: the turn is over (a sub-agent's is announced as such), and
        # the next message starts the next one.
        if ctx.run_id is not None:
            raise EndTurn(result, reply=acknowledgment, paused=False)
        return result
    fields: dict[str, Any] = {
        "yieldedAt": now_ms(),
        "yieldedRunId": ctx.run_id,  # None over /tools/invoke: no run yielded
        "yieldMessage": message,
    }
    if ctx.run_id is not None:
        raise EndTurn(result, session_fields=fields, reply=acknowledgment)
    if not store.yields.mark(ctx.session_key, fields):
        if wait_for == "message":
            return result  # the last child finished meanwhile: the next message wakes it
        return _error(NOTHING_PENDING)  # the last child finished meanwhile
    return result


SPEC = ToolSpec(
    name="sessions_yield",
    description=(
        "End your current turn. Use after spawning subagents to receive their results as "
        "the next message. Optional message: private context for the resumed turn; "
        'acknowledgment: a short visible reply for this turn; waitFor: "message" to '
        "yield with no pending subagent and wait for the next incoming message."
    ),
    parameters={
        "type": "object",
        "properties": {
            "message": {
                "type": "string",
                "description": 'Private context for the resumed turn (default "Turn yielded.").',
            },
            "acknowledgment": {
                "type": "string",
                "description": "A short visible reply for the turn that yields.",
            },
            "waitFor": {
                "type": "string",
                "description": '"message": wait for the next incoming message (no subagent '
                "needs to be pending).",
            },
        },
    },
    handler=_sessions_yield,
)
