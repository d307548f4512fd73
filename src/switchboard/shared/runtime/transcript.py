"""Conversion between pydantic-ai messages and the raw transcript format of SPEC §9 (OpenClaw's).

A transcript message is a JSON-ready dict:

    {"role": "user", "content": "hi", "timestamp": 1700000000000, "provenance"?: {...}}
    {"role": "assistant", "content": [blocks], "timestamp", "model", "provider",
     "usage": {"input", "output", "totalTokens"},
     "stopReason": "stop" | "toolUse" | "length" | "error"}
    {"role": "toolResult", "toolCallId", "toolName", "content": [{"type": "text", "text"}],
     "isError", "timestamp", "call"?: {server, tool, kind, arguments, durationMs,
     slotWaitMs?, outcome, cut?}}   (`call`: a call of an MCP or Python tool, `external_tools`)
    {"role": "system", "content": [{"type": "text", "text"}], "timestamp"}

with blocks `{type: "text", text}`, `{type: "toolCall", id, name, arguments}` and
`{type: "thinking", thinking}`. System prompts and instructions are not stored: they are
supplied per run. Going back, inter-session user messages get OpenClaw's first-line prefix
`[Inter-session message] sourceSession=<k> sourceChannel=<c> sourceTool=<t>`, so the model can
tell routed agent instructions from its user; OpenClaw's compaction markers are skipped and
other `system` messages become mid-conversation system notes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic_ai.messages import (
    ERROR_OUTCOMES,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    SystemPromptPart,
    TextContent,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage

from switchboard.shared.runtime.attachments import redact_spawn_arguments

__all__ = [
    "ModelUnit",
    "final_text",
    "fold_request",
    "fold_units",
    "inter_session_prefix",
    "latest_tool_result_text",
    "model_unit",
    "to_model_messages",
    "to_transcript",
]

Message = dict[str, Any]
# One transcript message in model form: an assistant turn is a response; any other
# message, the request parts it adds (consecutive ones are folded into one request).
ModelUnit = ModelResponse | tuple[ModelRequestPart, ...]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
# Marks a SystemPromptPart that came from a transcript `system` message, so it goes back there.
_SYSTEM_NOTE_KEY = "switchboard_system_note"
_STOP_REASONS = {"length": "length", "error": "error", "content_filter": "error"}
_FINISH_REASONS: dict[str, Any] = {"toolUse": "tool_call", "length": "length", "error": "error"}
_PROVENANCE_FIELDS = (
    ("sourceSession", "sourceSessionKey"),
    ("sourceChannel", "sourceChannel"),
    ("sourceTool", "sourceTool"),
)


def to_transcript(messages: Sequence[ModelMessage], *, model: str, provider: str) -> list[Message]:
    """Render a run's messages as transcript messages; `model`/`provider` label assistant turns."""
    out: list[Message] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            out.append(_assistant_message(message, model=model, provider=provider))
        else:
            out.extend(_request_messages(message))
    return out


def to_model_messages(transcript: Sequence[Mapping[str, Any]]) -> list[ModelMessage]:
    """Rebuild pydantic-ai history from a transcript, folding consecutive non-assistant turns."""
    return fold_units([model_unit(message) for message in transcript])


def model_unit(message: Mapping[str, Any]) -> ModelUnit:
    """One transcript message in model form, on its own (`fold_units` joins them): made
    once per message where a process keeps its sessions' recent history
    (`runtime.history_cache`). Treat it as read-only: runs share it."""
    if message.get("role") == "assistant":
        return _model_response(message)
    return tuple(_request_parts(message))


def fold_units(units: Iterable[ModelUnit]) -> list[ModelMessage]:
    """Messages in model form as pydantic-ai history: each response as is, the request
    parts between two responses folded into one request (a new one each time)."""
    out: list[ModelMessage] = []
    pending: list[tuple[ModelRequestPart, ...]] = []
    for unit in units:
        if isinstance(unit, ModelResponse):
            if (request := fold_request(pending)) is not None:
                out.append(request)
            pending = []
            out.append(unit)
        else:
            pending.append(unit)
    if (request := fold_request(pending)) is not None:
        out.append(request)
    return out


def fold_request(units: Sequence[tuple[ModelRequestPart, ...]]) -> ModelRequest | None:
    """The request the request parts of consecutive messages fold into (`fold_units`), or
    None when they hold no part."""
    parts = [part for unit in units for part in unit]
    return _request(parts) if parts else None


def final_text(messages: Sequence[ModelMessage]) -> str:
    """The text of the last model response among `messages` (the reply of a run), or `""`."""
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            return message.text or ""
    return ""


def latest_tool_result_text(transcript: Sequence[Mapping[str, Any]]) -> str | None:
    """The text of the newest `toolResult` message, or None when there is none."""
    for message in reversed(transcript):
        if message.get("role") == "toolResult":
            return _content_text(message.get("content"))
    return None


def inter_session_prefix(provenance: Mapping[str, Any]) -> str:
    """OpenClaw's first line for a replayed inter-session message (only the parts that exist)."""
    fields = [
        f"{label}={provenance[key]}" for label, key in _PROVENANCE_FIELDS if provenance.get(key)
    ]
    return " ".join(["[Inter-session message]", *fields])


# ---- pydantic-ai -> transcript ----


def _request_messages(request: ModelRequest) -> Iterator[Message]:
    for part in request.parts:
        if isinstance(part, UserPromptPart):
            yield {
                "role": "user",
                "content": _prompt_text(part),
                "timestamp": _to_ms(part.timestamp),
            }
        elif isinstance(part, ToolReturnPart):
            yield _tool_result_message(part)
        elif isinstance(part, SystemPromptPart) and _is_system_note(part):
            yield {
                "role": "system",
                "content": _text_blocks(part.content),
                "timestamp": _to_ms(part.timestamp),
            }
        # Other parts (system prompts, retry feedback, deltas) are per-run machinery, not history.


def _tool_result_message(part: ToolReturnPart) -> Message:
    message: Message = {
        "role": "toolResult",
        "toolCallId": part.tool_call_id,
        "toolName": part.tool_name,
        "content": _text_blocks(part.model_response_str(wrap_if_error=False)),
        "isError": part.outcome in ERROR_OUTCOMES,
        "timestamp": _to_ms(part.timestamp),
    }
    call = part.metadata.get("call") if isinstance(part.metadata, dict) else None
    if call:  # an MCP or Python tool's call: server, tool, arguments, duration, outcome
        message["call"] = call
    return message


def _assistant_message(response: ModelResponse, *, model: str, provider: str) -> Message:
    blocks = [block for part in response.parts if (block := _block(part)) is not None]
    has_calls = any(isinstance(part, ToolCallPart) for part in response.parts)
    usage = response.usage
    return {
        "role": "assistant",
        "content": blocks,
        "timestamp": _to_ms(response.timestamp),
        "model": model,
        "provider": provider,
        "usage": {
            "input": usage.input_tokens,
            "output": usage.output_tokens,
            "totalTokens": usage.input_tokens + usage.output_tokens,
        },
        "stopReason": "toolUse"
        if has_calls
        else _STOP_REASONS.get(response.finish_reason or "", "stop"),
    }


def _block(part: ModelResponsePart) -> Message | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.content}
    if isinstance(part, ThinkingPart):
        return {"type": "thinking", "thinking": part.content}
    if isinstance(part, ToolCallPart):
        arguments = part.args_as_dict()
        if part.tool_name == "sessions_spawn":  # attachments never reach a transcript
            arguments = redact_spawn_arguments(arguments)
        return {
            "type": "toolCall",
            "id": part.tool_call_id,
            "name": part.tool_name,
            "arguments": arguments,
        }
    return None  # native tool traffic, files and compaction items are provider state


def _prompt_text(part: UserPromptPart) -> str:
    if isinstance(part.content, str):
        return part.content
    return "\n".join(
        item if isinstance(item, str) else item.content
        for item in part.content
        if isinstance(item, str | TextContent)
    )


def _is_system_note(part: SystemPromptPart) -> bool:
    return bool(part.metadata and part.metadata.get(_SYSTEM_NOTE_KEY))


def _text_blocks(text: str) -> list[Message]:
    return [{"type": "text", "text": text}]


def _to_ms(moment: datetime | None) -> int:
    if moment is None:
        moment = datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _ONE_MS


# ---- transcript -> pydantic-ai ----


def _request(parts: list[ModelRequestPart]) -> ModelRequest:
    stamps = [stamp for part in parts if (stamp := getattr(part, "timestamp", None)) is not None]
    return ModelRequest(parts=parts, timestamp=stamps[0] if stamps else None)


def _request_parts(message: Mapping[str, Any]) -> Iterator[ModelRequestPart]:
    role, stamp = message.get("role"), _from_ms(message.get("timestamp"))
    text = _content_text(message.get("content"))
    if role == "user":
        yield UserPromptPart(_with_provenance(text, message.get("provenance")), timestamp=stamp)
    elif role in ("toolResult", "tool"):
        yield ToolReturnPart(
            tool_name=str(message.get("toolName") or ""),
            content=text,
            tool_call_id=str(message.get("toolCallId") or ""),
            outcome="failed" if message.get("isError") else "success",
            timestamp=stamp,
        )
    elif role == "system" and not _is_compaction_marker(message):
        yield SystemPromptPart(text, timestamp=stamp, metadata={_SYSTEM_NOTE_KEY: True})


def _with_provenance(text: str, provenance: Any) -> str:
    if not isinstance(provenance, Mapping) or provenance.get("kind") != "inter_session":
        return text
    return f"{inter_session_prefix(provenance)}\n{text}"


def _is_compaction_marker(message: Mapping[str, Any]) -> bool:
    marker = message.get("__openclaw")
    return isinstance(marker, Mapping) and marker.get("kind") == "compaction"


def _model_response(message: Mapping[str, Any]) -> ModelResponse:
    usage = message.get("usage") or {}
    return ModelResponse(
        parts=list(_response_parts(message.get("content"))),
        usage=RequestUsage(
            input_tokens=int(usage.get("input") or 0), output_tokens=int(usage.get("output") or 0)
        ),
        model_name=message.get("model"),
        timestamp=_from_ms(message.get("timestamp")),
        provider_name=message.get("provider"),
        finish_reason=_FINISH_REASONS.get(str(message.get("stopReason")), "stop"),
    )


def _response_parts(content: Any) -> Iterator[ModelResponsePart]:
    if isinstance(content, str):
        yield TextPart(content)
        return
    for block in _blocks(content):
        kind = block.get("type")
        if kind == "text":
            yield TextPart(str(block.get("text", "")))
        elif kind == "thinking":
            yield ThinkingPart(str(block.get("thinking", "")))
        elif kind == "toolCall":
            arguments = block.get("arguments")
            yield ToolCallPart(
                str(block.get("name", "")),
                dict(arguments) if isinstance(arguments, Mapping) else {},
                tool_call_id=str(block.get("id", "")),
            )


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        str(block.get("text", "")) for block in _blocks(content) if block.get("type") == "text"
    )


def _blocks(content: Any) -> Iterable[Mapping[str, Any]]:
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, Mapping)]


def _from_ms(value: Any) -> datetime:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _EPOCH + timedelta(milliseconds=int(value))
    return datetime.now(UTC)
