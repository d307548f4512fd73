"""`sessions_history`: read the last messages of a visible session, made safe for a model.

What ``chat.history`` shows (control-token-only assistant messages hidden), minus tool
results unless asked, with each message sanitised: ``details``/``usage``/``cost`` removed,
credential-looking strings redacted, texts over 4,000 characters cut, image data omitted;
and the whole answer kept under 80 KiB by dropping the oldest messages (SPEC §4, reference
§4.2). Flags in the result say what was cut, dropped or redacted.

``pendingInputs`` (OpenClaw 2026.9.6): the messages accepted for the session but not yet
taken by a run, i.e. the runs still ``queued`` on its lane (oldest first, at most
``MAX_PENDING_INPUTS``), sanitised the same way and counted in the 80 KiB. A run cancelled
before it started is not listed: it has left the lane and holds no input any more.

Departure from OpenClaw: removing the ``details``/``usage``/``cost`` metadata and thinking
signatures does not set ``contentTruncated`` (OpenClaw flags it, so nearly every answer
claims truncation and the flag tells a model nothing); only cut texts and omitted image
data do. Tool-call arguments are redacted too, not only texts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from switchboard.redact import redact_text
from switchboard.shared.errors import NotFound
from switchboard.shared.gateway.resolve import display_key, resolve_session_ref
from switchboard.shared.gateway.sessions import chat_history_method
from switchboard.shared.policy.visibility import Verdict
from switchboard.shared.tools.access import visibility_guard
from switchboard.shared.tools.args import read_bool, read_int, read_string
from switchboard.shared.tools.registry import ToolContext, ToolSpec

MAX_TEXT_CHARS = 4000
MAX_RESULT_BYTES = 80 * 1024
TRUNCATION_MARKER = "\n…(truncated)…"
TOO_LARGE_PLACEHOLDER = "[sessions_history omitted: message too large]"
TOOL_ROLES = frozenset({"toolResult", "tool"})
_METADATA_FIELDS = ("details", "usage", "cost")
_TEXT_FIELDS = ("text", "partialJson", "errorMessage")
_SANDBOX_SETTING = "agents.defaults.sandbox.sessionToolsVisibility=spawned"
MAX_PENDING_INPUTS = 20


class SanitizedMessage(NamedTuple):
    """A sanitised copy of one message and what sanitising did to it."""

    message: dict[str, Any]
    truncated: bool
    redacted: bool


@dataclass
class _Marks:
    """What happened while sanitising one message."""

    truncated: bool = False
    redacted: bool = False


@dataclass
class _Capped:
    """The messages left under the byte cap."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    dropped: bool = False
    bytes: int = 2


def sanitize_message(message: Mapping[str, Any]) -> SanitizedMessage:
    """A copy of ``message`` safe to show a model: metadata dropped, secrets masked, cut."""
    marks = _Marks()
    out = {k: v for k, v in message.items() if k not in _METADATA_FIELDS}
    content = out.get("content")
    if isinstance(content, str):
        out["content"] = _clean_text(content, marks)
    elif isinstance(content, list):
        out["content"] = [_clean_block(b, marks) if isinstance(b, dict) else b for b in content]
    for name in _TEXT_FIELDS:
        if isinstance(out.get(name), str):
            out[name] = _clean_text(out[name], marks)
    return SanitizedMessage(out, marks.truncated, marks.redacted)


def _clean_text(text: str, marks: _Marks) -> str:
    """Redact, then cut to MAX_TEXT_CHARS with the marker."""
    redacted = redact_text(text)
    if redacted != text:
        marks.redacted = True
    if len(redacted) > MAX_TEXT_CHARS:
        marks.truncated = True
        return redacted[:MAX_TEXT_CHARS] + TRUNCATION_MARKER
    return redacted


def _clean_block(block: Mapping[str, Any], marks: _Marks) -> dict[str, Any]:
    """One content block: texts cleaned, thinking signature and image data removed."""
    out = dict(block)
    for name in _TEXT_FIELDS:
        if isinstance(out.get(name), str):
            out[name] = _clean_text(out[name], marks)
    kind = out.get("type")
    if kind == "thinking":
        out.pop("thinkingSignature", None)
        if isinstance(out.get("thinking"), str):
            out["thinking"] = _clean_text(out["thinking"], marks)
    elif kind == "image":
        data = out.pop("data", None)
        if isinstance(data, str):
            marks.truncated = True
            out["bytes"] = len(data)
        out["omitted"] = True
    elif kind == "toolCall" and "arguments" in out:
        out["arguments"] = _clean_value(out["arguments"], marks)
    return out


def _clean_value(value: Any, marks: _Marks) -> Any:
    """Clean every string inside a JSON value (tool-call arguments)."""
    if isinstance(value, str):
        return _clean_text(value, marks)
    if isinstance(value, list):
        return [_clean_value(v, marks) for v in value]
    if isinstance(value, dict):
        return {k: _clean_value(v, marks) for k, v in value.items()}
    return value


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (what the byte cap counts)."""
    return len(orjson.dumps(value))


def cap_messages(messages: Sequence[dict[str, Any]], cap: int = MAX_RESULT_BYTES) -> _Capped:
    """Drop the oldest messages until the JSON array fits ``cap``; one too-large message
    alone becomes the placeholder."""
    sizes = [json_size(m) for m in messages]
    total = 2 + sum(sizes) + max(0, len(sizes) - 1)
    start = 0
    while total > cap and len(sizes) - start > 1:
        total -= sizes[start] + 1
        start += 1
    kept = list(messages[start:])
    if total <= cap:
        return _Capped(kept, dropped=start > 0, bytes=total)
    placeholder = [{"role": "assistant", "content": TOO_LARGE_PLACEHOLDER}]
    return _Capped(placeholder, dropped=True, bytes=json_size(placeholder))


def sandbox_restricted(ctx: ToolContext) -> bool:
    """True when the caller is sandboxed and its sandbox limits it to spawned sessions."""
    sandbox = ctx.services.config.sandbox_for(ctx.agent_id)
    return ctx.sandboxed and sandbox.session_tools_visibility == "spawned"


def forbidden_result(ctx: ToolContext, raw: str, verdict: Verdict) -> dict[str, Any]:
    """The forbidden outcome; a sandboxed caller is told the sandbox is why."""
    error = verdict.error or "Session not visible."
    if sandbox_restricted(ctx):
        error = f"Session not visible from this sandboxed agent session: {raw} ({_SANDBOX_SETTING})"
    return {"status": "forbidden", "error": error}


def _sessions_history(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    raw = read_string(args, "sessionKey", required=True) or ""
    limit = read_int(args, "limit", default=50, lo=1, hi=1000)
    include_tools = read_bool(args, "includeTools")
    svc = ctx.services
    try:
        key = resolve_session_ref(svc, raw, requester_key=ctx.session_key)
    except NotFound as exc:
        return {"status": "error", "error": exc.message}
    verdict = visibility_guard(ctx).check(key, "history")
    if not verdict.allowed:
        return forbidden_result(ctx, raw, verdict)
    history = chat_history_method(svc, {"sessionKey": key, "limit": limit})
    messages = [m for m in history["messages"] if include_tools or m.get("role") not in TOOL_ROLES]
    pending = pending_inputs(ctx, key)
    cleaned = [sanitize_message(m) for m in messages]
    capped = cap_messages([c.message for c in cleaned], MAX_RESULT_BYTES - json_size(pending))
    content_truncated = any(c.truncated for c in cleaned)
    return {
        "sessionKey": display_key(svc, key, ctx.agent_id),
        "messages": capped.messages,
        "pendingInputs": pending,
        "truncated": capped.dropped or content_truncated,
        "droppedMessages": capped.dropped,
        "contentTruncated": content_truncated,
        "contentRedacted": any(c.redacted for c in cleaned),
        "bytes": capped.bytes,
    }


def pending_inputs(ctx: ToolContext, key: str) -> list[dict[str, Any]]:
    """The session's accepted inputs no run has taken yet: its lane's queued runs."""
    runs = ctx.services.store.runs
    holder, queued = runs.lane_holder(key), runs.lane_queue(key)
    ids = ([holder] if holder else []) + queued[:MAX_PENDING_INPUTS]
    out = []
    for run in runs.get_many(ids):
        if run is None or run.status != "queued" or not run.message:
            continue
        item: dict[str, Any] = {"runId": run.run_id, "status": "queued"}
        item["message"] = sanitize_message(run.message).message
        if run.created_at_ms:
            item["acceptedAt"] = run.created_at_ms
        out.append(item)
    return out[:MAX_PENDING_INPUTS]


SPEC = ToolSpec(
    name="sessions_history",
    description="Fetch message history for a session.",
    parameters={
        "type": "object",
        "properties": {
            "sessionKey": {
                "type": "string",
                "description": (
                    "Session to read: a key from sessions_list, `main`, `current` (this "
                    "session) or a sessionId."
                ),
            },
            "limit": {
                "type": "number",
                "minimum": 1,
                "description": "Max messages to return (default 50, at most 1000).",
            },
            "includeTools": {
                "type": "boolean",
                "description": "Include tool result messages (default false).",
            },
        },
        "required": ["sessionKey"],
    },
    handler=_sessions_history,
)
