"""Client-side tools on the OpenAI-compatible api: the request's `tools`, and their calls.

A chat completion (`tools`: `{"type": "function", "function": {name, description,
parameters, strict}}`) or a response (`tools`: `{"type": "function", name, ...}`) may
define function tools; they are checked (`runtime.client_tools.check_client_tools`) and
carried with the run, whose model is offered them beside the agent's own. When the model
calls one, the run ends with the call (`RunRecord.tool_calls`), answered as
`finish_reason: "tool_calls"` / `function_call` output items. The client's next request
carries the results (`tool` messages / `function_call_output` items): they must answer
exactly the calls the session's last run ended on, and start the run that continues it
(once: a retry, named by its calls' ids, is answered by the same run).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall, ChoiceDeltaToolCallFunction
from openai.types.responses import (
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
)
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from switchboard.shared.errors import InvalidInput
from switchboard.shared.gateway.openai_bodies import chat_tool_calls, function_call_items
from switchboard.shared.runtime.client_tools import MAX_TOOLS, check_client_tools
from switchboard.shared.services import Services

__all__ = [
    "ChatTool",
    "Continuation",
    "ResponsesTool",
    "chat_tool_calls",
    "chat_tool_deltas",
    "chat_tools",
    "continuation",
    "function_call_events",
    "function_call_items",
    "responses_tools",
    "tools_field",
]

# How many argument characters one streamed tool-call delta carries.
ARGUMENT_CHUNK = 256
_NO_CALLS = "the session has no tool calls waiting for results (its last run ended without any)"


class FunctionDef(BaseModel):
    """A chat tool's `function`."""

    model_config = ConfigDict(extra="ignore")

    name: StrictStr = Field(max_length=64)
    description: StrictStr | None = Field(default=None, max_length=16_384)
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ChatTool(BaseModel):
    """One tool of a chat completion request (only `function` tools are accepted)."""

    model_config = ConfigDict(extra="ignore")

    type: StrictStr = Field(max_length=64)
    function: FunctionDef | None = None


class ResponsesTool(BaseModel):
    """One tool of a Responses request (only `function` tools are accepted)."""

    model_config = ConfigDict(extra="ignore")

    type: StrictStr = Field(max_length=64)
    name: StrictStr | None = Field(default=None, max_length=64)
    description: StrictStr | None = Field(default=None, max_length=16_384)
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


def tools_field() -> Any:
    """A request's `tools` field: at most `MAX_TOOLS`."""
    return Field(default=None, max_length=MAX_TOOLS)


def _neutral(name: str, description: str | None, parameters: Any, strict: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if description:
        out["description"] = description
    if parameters is not None:
        out["parameters"] = parameters
    if strict is not None:
        out["strict"] = strict
    return out


def _not_function(kind: str, field: str) -> InvalidInput:
    return InvalidInput(
        f"unsupported tool type {kind!r}: only 'function' tools are accepted", field=field
    )


def _choice(choice: Any, named: str | None) -> Any:
    """A tool choice in the neutral shape ("auto", "none", "required", {"name"})."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function" and named:
        return {"name": named}
    raise InvalidInput(
        "tool_choice must be 'auto', 'none', 'required' or a function tool to call",
        field="tool_choice",
    )


def chat_tools(
    svc: Services, tools: Sequence[ChatTool] | None, choice: Any
) -> tuple[list[dict[str, Any]], Any]:
    """A chat request's tools and tool choice, checked, in the neutral shape."""
    defs = []
    for i, tool in enumerate(tools or ()):
        if tool.type != "function":
            raise _not_function(tool.type, f"tools[{i}].type")
        if tool.function is None:
            raise InvalidInput("a function tool needs its 'function'", field=f"tools[{i}].function")
        f = tool.function
        defs.append(_neutral(f.name, f.description, f.parameters, f.strict))
    function = choice.get("function") if isinstance(choice, Mapping) else None
    named = function.get("name") if isinstance(function, Mapping) else None
    neutral = _choice(choice, str(named) if named else None)
    check_client_tools(defs, neutral, svc.tools.names(), field="tools")
    return defs, neutral


def responses_tools(
    svc: Services, tools: Sequence[ResponsesTool] | None, choice: Any
) -> tuple[list[dict[str, Any]], Any]:
    """A Responses request's tools and tool choice, checked, in the neutral shape."""
    defs = []
    for i, tool in enumerate(tools or ()):
        if tool.type != "function":
            raise _not_function(tool.type, f"tools[{i}].type")
        if tool.name is None:
            raise InvalidInput("a function tool needs its 'name'", field=f"tools[{i}].name")
        defs.append(_neutral(tool.name, tool.description, tool.parameters, tool.strict))
    named = choice.get("name") if isinstance(choice, Mapping) else None
    neutral = _choice(choice, str(named) if named else None)
    check_client_tools(defs, neutral, svc.tools.names(), field="tools")
    return defs, neutral


@dataclass(frozen=True)
class Continuation:
    """The run that continues a session with the client's results: its tool results, and
    the idempotency key that makes a retry find it."""

    results: list[dict[str, Any]]
    idempotency_key: str


def continuation(
    svc: Services, session_key: str, given: Sequence[tuple[str, str]], *, field: str
) -> Continuation:
    """The client's results (call id, output) for the calls the session's last run ended
    on: every one of those calls answered once, and nothing else (else `InvalidInput`)."""
    entry = svc.store.sessions.get(session_key)
    last = str(entry.get("lastRunId") or "") if entry is not None else ""
    run = svc.store.runs.get(last) if last else None
    calls = {str(c["id"]): str(c["name"]) for c in (run.tool_calls if run is not None else [])}
    if run is not None and not calls:  # a retry once the continuation started: the same run
        calls = {str(r["toolCallId"]): str(r["toolName"]) for r in run.tool_results}
        if sorted(calls) != sorted(call_id for call_id, _ in given):
            calls = {}
    if not calls:
        raise InvalidInput(_NO_CALLS, field=field)
    seen: set[str] = set()
    results = []
    for call_id, output in given:
        if call_id not in calls:
            raise InvalidInput(
                f"no tool call with id {call_id!r} waits for a result in this session", field=field
            )
        if call_id in seen:
            raise InvalidInput(f"tool call {call_id!r} is answered twice", field=field)
        seen.add(call_id)
        results.append({"toolCallId": call_id, "toolName": calls[call_id], "content": output})
    missing = [c for c in calls if c not in seen]
    if missing:
        raise InvalidInput(
            "every tool call needs its result; missing: " + ", ".join(missing), field=field
        )
    named = hashlib.sha256(",".join(sorted(seen)).encode()).hexdigest()[:32]
    return Continuation(results, idempotency_key=f"client-tools:{named}")


def chat_tool_deltas(calls: Sequence[Mapping[str, Any]]) -> list[ChoiceDeltaToolCall]:
    """A run's client calls as streamed deltas, the way OpenAI streams them: each call's
    first delta has its index, id, type and name, the next ones its arguments in chunks."""
    out = []
    for index, c in enumerate(calls):
        arguments = str(c["arguments"])
        chunks = [
            arguments[i : i + ARGUMENT_CHUNK] for i in range(0, len(arguments), ARGUMENT_CHUNK)
        ]
        out.append(
            ChoiceDeltaToolCall(
                index=index,
                id=str(c["id"]),
                type="function",
                function=ChoiceDeltaToolCallFunction(name=str(c["name"]), arguments=""),
            )
        )
        out += [
            ChoiceDeltaToolCall(index=index, function=ChoiceDeltaToolCallFunction(arguments=part))
            for part in chunks
        ]
    return out


def function_call_events(
    calls: Sequence[Mapping[str, Any]], first_index: int
) -> list[Callable[[int], BaseModel]]:
    """A response's streamed events for the client's calls, from output index
    ``first_index``: each item added, its arguments (delta, done), the item done. Each
    maker takes the event's sequence number."""
    events: list[BaseModel] = []
    pending = function_call_items(calls, done=False)
    for offset, (item, done) in enumerate(zip(pending, function_call_items(calls), strict=True)):
        index = first_index + offset
        where: dict[str, Any] = {"item_id": done.id, "output_index": index, "sequence_number": 0}
        events += [
            ResponseOutputItemAddedEvent(
                type="response.output_item.added", sequence_number=0, output_index=index, item=item
            ),
            ResponseFunctionCallArgumentsDeltaEvent(
                type="response.function_call_arguments.delta", delta=done.arguments, **where
            ),
            ResponseFunctionCallArgumentsDoneEvent(
                type="response.function_call_arguments.done",
                arguments=done.arguments,
                name=done.name,
                **where,
            ),
            ResponseOutputItemDoneEvent(
                type="response.output_item.done", sequence_number=0, output_index=index, item=done
            ),
        ]
    return [_numbered(e) for e in events]


def _numbered(event: BaseModel) -> Callable[[int], BaseModel]:
    """The event with its sequence number, once it has one."""
    return lambda n: event.model_copy(update={"sequence_number": n})
