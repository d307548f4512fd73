"""`session_status`: a `/status`-style card for the caller's session or a visible one.

``sessionKey`` defaults to the caller's own session (``current`` too; ``main`` and a
sessionId resolve as in ``sessions_history``). The same visibility guard and agent-to-agent
rules as the other session tools apply (action ``status``), checked before the session is
looked up, so a forbidden key never tells whether it exists; then a key with no entry is
"Unknown sessionKey: <key>" (OpenClaw's text).

The card: the model the session last ran with (else the agent's configured one), token
usage, timing (created, updated, the last run's start and end), the lane (runs queued
behind the current one) and the current run (the run holding the lane, with its status).

Usage is the sum of the session's run records' usage: each run's end step
(`finish_run.lua`) writes the run's ``usage`` and adds the same numbers to the session's
``inputTokens``/``outputTokens``/``totalTokens`` in one step, so the totals read here are
exact and survive the run records' retention (a run record expires, its tokens stay
counted). ``contextTokens`` is the last run's prompt size.

``model`` (deprecated in OpenClaw) is accepted and ignored: sessions here carry no model
override that runs honour (a run's model is its request's, else the agent's), so the card
says ``changedModel: false`` and notes why, rather than claim a change.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.errors import NotFound
from switchboard.shared.gateway.resolve import display_key, resolve_session_ref
from switchboard.shared.services import Services
from switchboard.shared.store.run_records import RunRecord
from switchboard.shared.store.sessions import SessionEntry
from switchboard.shared.tools.access import visibility_guard
from switchboard.shared.tools.args import read_string
from switchboard.shared.tools.offer import offered_names
from switchboard.shared.tools.registry import ToolContext, ToolSpec
from switchboard.shared.tools.sessions_history import forbidden_result

MODEL_IGNORED_NOTE = (
    "model overrides are not supported here: the session keeps the model its runs are "
    "configured with (the agent's model unless a run names one)"
)
_USAGE_FIELDS = ("inputTokens", "outputTokens", "totalTokens", "contextTokens")


def _session_status(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    svc = ctx.services
    raw = read_string(args, "sessionKey")
    model_arg = read_string(args, "model")
    try:
        key = (
            ctx.session_key
            if raw is None
            else resolve_session_ref(svc, raw, requester_key=ctx.session_key)
        )
    except NotFound:
        return {"status": "error", "error": f"Unknown sessionKey: {raw}"}
    verdict = visibility_guard(ctx).check(key, "status")
    if not verdict.allowed:
        return forbidden_result(ctx, raw or "current", verdict)
    entry = svc.store.sessions.get(key)
    if entry is None:
        shown = raw or display_key(svc, key, ctx.agent_id)
        return {"status": "error", "error": f"Unknown sessionKey: {shown}"}
    card = status_card(svc, entry, ctx.agent_id)
    card["tools"] = offered_names(svc, sk.agent_id_of(entry.key), entry.key, entry.fields)
    card["changedModel"] = False
    if model_arg is not None:
        card["modelNote"] = MODEL_IGNORED_NOTE
    return card


def status_card(svc: Services, entry: SessionEntry, requester_agent: str) -> dict[str, Any]:
    """The status card of one session (no visibility check: the caller made it)."""
    holder, queued = svc.store.runs.lane_state(entry.key)
    last_id = _text(entry.get("lastRunId"))
    wanted = [run_id for run_id in dict.fromkeys([holder, last_id]) if run_id]
    runs = {rec.run_id: rec for rec in svc.store.runs.get_many(wanted) if rec is not None}
    current = runs.get(holder) if holder else None
    last = runs.get(last_id) if last_id else None
    agent_id = sk.agent_id_of(entry.key)
    provider, model = _model_of(svc, entry, agent_id)
    card: dict[str, Any] = {
        "ok": True,
        "sessionKey": display_key(svc, entry.key, requester_agent),
        "agentId": agent_id,
        "sessionId": entry.session_id,
        "model": model,
        "active": holder is not None,
        "usage": {name: _count(entry.get(name)) for name in _USAGE_FIELDS},
        "time": _timing(entry, last),
        "queue": {"depth": queued},
        "currentRun": _run_brief(holder, current) if holder else None,
    }
    if provider:
        card["modelProvider"] = provider
    if label := _text(entry.get("label")):
        card["label"] = label
    if last_id:
        card["lastRun"] = _run_brief(last_id, last)
    card["statusText"] = _status_text(card)
    return card


def _model_of(svc: Services, entry: SessionEntry, agent_id: str) -> tuple[str | None, str]:
    """(provider, model): what the session last ran with, else the agent's configured model."""
    model = _text(entry.get("model"))
    provider = _text(entry.get("modelProvider"))
    if model is None:
        provider, _, model = svc.config.model_for(agent_id).partition("/")
    elif provider is None and "/" in model:
        provider, _, model = model.partition("/")
    return provider or None, model


def _timing(entry: SessionEntry, last: RunRecord | None) -> dict[str, int | None]:
    """When the session was created and last updated, and its last run's start and end."""
    return {
        "createdAt": _count(entry.get("createdAt")) or None,
        "updatedAt": entry.updated_at_ms or None,
        "lastRunStartedAt": last.started_at_ms if last else None,
        "lastRunEndedAt": last.ended_at_ms if last else None,
    }


def _run_brief(run_id: str, rec: RunRecord | None) -> dict[str, Any]:
    """A run's id and status (``unknown`` once its record has expired)."""
    out: dict[str, Any] = {"runId": run_id, "status": rec.status if rec else "unknown"}
    if rec is not None:
        if rec.started_at_ms:
            out["startedAt"] = rec.started_at_ms
        if rec.ended_at_ms:
            out["endedAt"] = rec.ended_at_ms
    return out


def _status_text(card: dict[str, Any]) -> str:
    """The card as a few human-readable lines (what OpenClaw's `/status` shows)."""
    model = card["model"]
    if card.get("modelProvider"):
        model = f"{card['modelProvider']}/{model}"
    usage = card["usage"]
    lines = [
        f"Session: {card['sessionKey']} (agent {card['agentId']})",
        f"Model: {model}",
        f"Tokens: {usage['inputTokens']} in / {usage['outputTokens']} out "
        f"({usage['totalTokens']} total; context {usage['contextTokens']})",
    ]
    current = card["currentRun"]
    run_text = f"{current['runId']} ({current['status']})" if current else "none"
    lines.append(f"Current run: {run_text}; queued behind it: {card['queue']['depth']}")
    time = card["time"]
    lines.append(f"Updated: {_iso(time['updatedAt'])}; created: {_iso(time['createdAt'])}")
    if "lastRun" in card:
        last = card["lastRun"]
        lines.append(
            f"Last run: {last['runId']} ({last['status']}), started "
            f"{_iso(time['lastRunStartedAt'])}, ended {_iso(time['lastRunEndedAt'])}"
        )
    return "\n".join(lines)


def _iso(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


SPEC = ToolSpec(
    name="session_status",
    description=(
        "Show a status card for this session (default) or another visible session: model, "
        "token usage, timing, queue depth and the current run."
    ),
    parameters={
        "type": "object",
        "properties": {
            "sessionKey": {
                "type": "string",
                "description": (
                    "Session to describe: omit or `current` for this session; a key from "
                    "sessions_list, `main`, or a sessionId."
                ),
            },
            "model": {
                "type": "string",
                "description": (
                    "Deprecated; accepted and ignored here (sessions have no model override)."
                ),
            },
        },
    },
    handler=_session_status,
)
