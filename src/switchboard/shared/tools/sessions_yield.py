"""`sessions_yield`: end the current turn; the pending children's results arrive as the next
message (OpenClaw's tool, reference §5.1).

In an agent run the call ends the run (`EndTurn`): it ends ``ok`` with the run record's
``yielded`` flag set and no reply beyond what the model said with the call, and the same
end step marks the session yielded (``yieldedAt``, ``yieldedRunId``, ``yieldMessage`` on its
entry). Over ``/tools/invoke`` there is no turn to end: the session is marked yielded
(only if a child is pending, checked in the same step). Either way the announces of its
children then start its next run, batched (``flows/yield_wake.py``).

Refused (status ``error``, OpenClaw's text) when nothing the session spawned is still
pending with a completion to announce (collectors, ``collect: true``, are drained with
``agents_wait``; ``expectsCompletionMessage: false`` children announce nothing).

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
    "sessions_yield requires at least one pending descendant subagent. This session has no "
    "descendant work to wait for; continue the assigned task now and return its verified "
    "result."
)


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
    store = ctx.services.store
    if not awaited_children(ctx, ctx.session_key):
        return _error(NOTHING_PENDING)
    fields: dict[str, Any] = {
        "yieldedAt": now_ms(),
        "yieldedRunId": ctx.run_id,  # None over /tools/invoke: no run yielded
        "yieldMessage": message,
    }
    result = {"status": "yielded", "message": message}
    if ctx.run_id is not None:
        raise EndTurn(result, session_fields=fields)
    if not store.yields.mark(ctx.session_key, fields):
        return _error(NOTHING_PENDING)  # the last child finished meanwhile
    return result


SPEC = ToolSpec(
    name="sessions_yield",
    description=(
        "End your current turn. Use after spawning subagents to receive their results as "
        "the next message. Optional message: private context for the resumed turn."
    ),
    parameters={
        "type": "object",
        "properties": {
            "message": {
                "type": "string",
                "description": 'Private context for the resumed turn (default "Turn yielded.").',
            }
        },
    },
    handler=_sessions_yield,
)
