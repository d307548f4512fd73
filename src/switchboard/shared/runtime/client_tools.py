"""Client-side tools: tools a request brings (OpenAI `tools`), executed by the client.

A request to the OpenAI-compatible api may define function tools. They are offered to the
run's model beside the agent's own as pydantic-ai external tools (`ExternalToolset`): the
model loop defers their calls without executing them, and the run ends with those calls
(`RunRecord.tool_calls`) for the client to execute. The client's next request carries the
results; the run it starts has no user message, and the results join its history
(`tool_returns`) where the model is asked again.

The definitions travel with the run (its hash, `NewRun.client_tools`) in a neutral shape,
``{"name", "description", "parameters", "strict"}``; the tool choice as
``"auto" | "none" | "required" | {"name": <tool>}``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import DeferredToolRequests, ToolDefinition
from pydantic_ai.toolsets import ExternalToolset

from switchboard.shared.errors import InvalidInput
from switchboard.shared.store import codec

__all__ = [
    "CLIENT_CALLS_FIELD",
    "MAX_TOOLS",
    "MAX_TOOLS_BYTES",
    "NOT_AWAITED",
    "NO_RESULT",
    "ClientCall",
    "answer_left_calls",
    "check_client_tools",
    "client_call",
    "client_calls",
    "client_toolset",
    "last_text",
    "tool_returns",
    "tool_settings",
]

# The session field set once a run of the session ended on client calls: only such a
# session's history may hold calls left without results (`answer_left_calls`).
CLIENT_CALLS_FIELD = "clientToolCalls"
# OpenAI's own bound on a request's tools, and on their definitions' size as JSON.
MAX_TOOLS = 128
MAX_TOOLS_BYTES = 256 * 1024
# OpenAI's function names: letters, digits, underscores and dashes, at most 64.
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def check_client_tools(
    tools: Sequence[Mapping[str, Any]], choice: Any, reserved: Collection[str], *, field: str
) -> None:
    """Refuse client tools a run cannot take (`InvalidInput` naming ``field``): too many or
    too large, a bad or repeated name, a name of the agent's own tools (``reserved``), a
    schema that is not an object, or a tool choice naming no given tool."""
    if len(tools) > MAX_TOOLS:
        raise InvalidInput(f"at most {MAX_TOOLS} tools are accepted", field=field)
    if len(codec.dumps(list(tools))) > MAX_TOOLS_BYTES:
        raise InvalidInput(
            f"the tool definitions take more than {MAX_TOOLS_BYTES} bytes as JSON", field=field
        )
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = str(tool.get("name") or "")
        if not TOOL_NAME.fullmatch(name):
            raise InvalidInput(
                f"invalid tool name {name!r}: 1 to 64 letters, digits, '_' or '-'",
                field=f"{field}[{i}]",
            )
        if name in reserved:
            raise InvalidInput(
                f"tool name {name!r} is one of the agent's own tools; rename the client tool",
                field=f"{field}[{i}]",
            )
        if name in seen:
            raise InvalidInput(f"tool name {name!r} is given twice", field=f"{field}[{i}]")
        seen.add(name)
        schema = tool.get("parameters")
        if schema is not None and (
            not isinstance(schema, Mapping) or schema.get("type", "object") != "object"
        ):
            raise InvalidInput(
                "a tool's parameters must be a JSON Schema of type 'object'",
                field=f"{field}[{i}]",
            )
    if isinstance(choice, Mapping) and choice.get("name") not in seen:
        raise InvalidInput(
            f"tool_choice names tool {choice.get('name')!r}, which is not among the tools",
            field="tool_choice",
        )
    if choice == "required" and not tools:
        raise InvalidInput("tool_choice 'required' needs at least one tool", field="tool_choice")


def client_toolset(tools: Sequence[Mapping[str, Any]], choice: Any) -> ExternalToolset[Any] | None:
    """The run's client tools as an external toolset (None without any, or with the tool
    choice "none": the model is not offered them)."""
    if not tools or choice == "none":
        return None
    defs = [
        ToolDefinition(
            name=str(t["name"]),
            description=t.get("description") or None,
            parameters_json_schema=dict(t.get("parameters") or _EMPTY_SCHEMA),
            strict=bool(t.get("strict")),  # as OpenAI: strict only when asked
            sequential=True,
        )
        for t in tools
    ]
    return ExternalToolset(defs, id="client")


def tool_settings(choice: Any) -> ModelSettings | None:
    """The model settings a tool choice asks for: "required" makes the model call a tool,
    ``{"name": x}`` call that one; "auto" and "none" ask for nothing."""
    if choice == "required":
        return ModelSettings(tool_choice="required")
    if isinstance(choice, Mapping) and choice.get("name"):
        return ModelSettings(tool_choice=[str(choice["name"])])
    return None


@dataclass(frozen=True)
class ClientCall:
    """A call of a client tool the run ended on, as the client is given it."""

    id: str
    name: str
    arguments: str

    def to_json(self) -> dict[str, str]:
        """As the run records it (`RunRecord.tool_calls`)."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


def client_call(part: ToolCallPart) -> ClientCall:
    """A deferred call as the client executes it (arguments as JSON text)."""
    return ClientCall(part.tool_call_id, part.tool_name, part.args_as_json_str())


def tool_returns(
    results: Sequence[Mapping[str, Any]], history: Sequence[ModelMessage]
) -> list[ToolReturnPart]:
    """The client's results (``{toolCallId, toolName, content}``) as tool returns, but for
    calls the history already answers (a run tried again after it parked once)."""
    answered = {
        part.tool_call_id
        for message in history[-4:]
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    return [
        ToolReturnPart(
            tool_name=str(r["toolName"]),
            content=r.get("content", ""),
            tool_call_id=str(r["toolCallId"]),
        )
        for r in results
        if str(r["toolCallId"]) not in answered
    ]


# The return of a call that was to wait on another run when the same answer called a
# client tool: the run ends for the client, and waits on nothing.
NOT_AWAITED = {
    "status": "error",
    "error": "not awaited: the run ended to let the client execute its tool calls",
}


def client_calls(requests: DeferredToolRequests) -> tuple[list[ClientCall], list[ToolReturnPart]]:
    """The client's calls among a run's deferred ones, and the returns of the others when
    there are any (a run ending for the client waits on no other run)."""
    calls = [
        client_call(c)
        for c in requests.calls
        if requests.metadata.get(c.tool_call_id, {}).get("external")
    ]
    if not calls:
        return [], []
    others = [
        ToolReturnPart(
            tool_name=c.tool_name, content=dict(NOT_AWAITED), tool_call_id=c.tool_call_id
        )
        for c in requests.calls
        if not requests.metadata.get(c.tool_call_id, {}).get("external")
    ]
    return calls, others


def last_text(messages: Sequence[ModelMessage]) -> str:
    """What the model said with its last answer (its calls aside)."""
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            return message.text or ""
    return ""


# The return a model is shown for a call the client never answered (it sent a new message).
NO_RESULT = {"status": "error", "error": "no result: the client sent a new message instead"}


def answer_left_calls(history: Sequence[ModelMessage]) -> list[ModelMessage]:
    """The history as the model is sent it: a call left without a result when a new user
    message came (a client that did not send its tool's result) is answered `NO_RESULT`
    just before that message, since providers refuse calls without results. The
    transcript keeps the call as it was; ``history`` is not changed (a copy)."""
    out = list(history)
    waiting: dict[str, str] = {}
    for i, message in enumerate(out):
        if isinstance(message, ModelResponse):
            waiting = {c.tool_call_id: c.tool_name for c in message.tool_calls}
            continue
        if not waiting:
            continue
        for part in message.parts:
            if isinstance(part, ToolReturnPart | RetryPromptPart):
                waiting.pop(part.tool_call_id, None)
        if waiting and any(isinstance(p, UserPromptPart) for p in message.parts):
            returns = [
                ToolReturnPart(tool_name=name, content=dict(NO_RESULT), tool_call_id=call_id)
                for call_id, name in waiting.items()
            ]
            out[i] = replace(message, parts=[*returns, *message.parts])
            waiting = {}
    return out
