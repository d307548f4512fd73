"""The built-in offline model `builtin/echo`: deterministic, no network, for demos and tests.

It is not a language model. It reads the latest user message and answers by these rules,
one directive per line (a leading `[Inter-session message] ...` line is ignored):

    /tool <name> <json-object>   call tool <name> with those arguments (the object may be
                                 left out for no arguments); several lines make several
                                 calls in one response, with ids echo_1, echo_2, ... counted
                                 over the whole conversation
    /reply <text>                answer exactly <text> (several lines are joined with a newline)
    /sleep <seconds>             take that long to answer (combines with the others)
    /fail <message>              the model call fails with <message>

Without `/tool` or `/reply`, the answer is the message itself minus directive lines
(`ok` when nothing is left). Once tool results come back, the answer is each result's content
as compact JSON (a string as is), one per line, unless the message had a `/reply` line, which
then wins. `/sleep` and `/fail` apply to the first model call of a turn only.

A malformed directive (bad JSON, a negative sleep) fails the model call and names the line.

Usage counts words (whitespace-separated): input is the words of all messages sent to the
model (instructions not counted), output the words of the reply, or of each call's
`name json-args` for tool calls. Streamed requests report the same numbers. A model counts
each message once while it lives (`_MessageCounts`): a session's history is the same
message objects run after run (`runtime.history_cache`), so a long session's runs do not
count its whole history again.

    hello there                       -> hello there
    /tool sessions_list {"limit": 5}  -> calls sessions_list, then replies with its JSON
    /reply REPLY_SKIP                 -> REPLY_SKIP
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pydantic_ai.exceptions import ModelAPIError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
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
from pydantic_ai.models import CompletedStreamedResponse, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RequestUsage

__all__ = [
    "ECHO_MODEL_NAME",
    "ECHO_MODEL_REF",
    "DirectiveError",
    "Directives",
    "EchoModel",
    "ToolCallDirective",
    "count_words",
    "echo_model",
    "parse_directives",
    "reply_after_tools",
    "reply_without_tools",
    "strip_inter_session_prefix",
]

ECHO_MODEL_REF = "builtin/echo"
ECHO_MODEL_NAME = "echo"
INTER_SESSION_PREFIX = "[Inter-session message]"
_EMPTY_REPLY = "ok"


class DirectiveError(ValueError):
    """A directive line could not be parsed."""


@dataclass(frozen=True)
class ToolCallDirective:
    """One `/tool` line: the tool to call and its arguments."""

    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Directives:
    """What a user message asks the echo model to do."""

    text: str
    tool_calls: tuple[ToolCallDirective, ...] = ()
    reply: str | None = None
    sleep_s: float = 0.0
    fail: str | None = None


def strip_inter_session_prefix(text: str) -> str:
    """Drop a leading `[Inter-session message] ...` line, as added when a transcript is replayed."""
    if not text.startswith(INTER_SESSION_PREFIX):
        return text
    _, _, rest = text.partition("\n")
    return rest


def parse_directives(text: str) -> Directives:
    """Read the directive lines of a user message; raise `DirectiveError` on a malformed one."""
    tool_calls: list[ToolCallDirective] = []
    replies: list[str] = []
    plain: list[str] = []
    sleep_s, fail = 0.0, None
    for line in strip_inter_session_prefix(text).splitlines():
        word, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if word == "/tool":
            tool_calls.append(_parse_tool_line(line, rest))
        elif word == "/reply":
            replies.append(rest)
        elif word == "/sleep":
            sleep_s = _parse_sleep(line, rest)
        elif word == "/fail":
            fail = rest or "echo: failure requested"
        else:
            plain.append(line)
    reply = "\n".join(replies) if replies else None
    return Directives("\n".join(plain).strip(), tuple(tool_calls), reply, sleep_s, fail)


def _parse_tool_line(line: str, rest: str) -> ToolCallDirective:
    name, _, raw_args = rest.partition(" ")
    if not name:
        raise DirectiveError(f"echo: /tool needs a tool name: {line!r}")
    try:
        args = json.loads(raw_args) if raw_args.strip() else {}
    except ValueError as exc:
        raise DirectiveError(f"echo: /tool arguments are not JSON: {line!r}") from exc
    if not isinstance(args, dict):
        raise DirectiveError(f"echo: /tool arguments must be a JSON object: {line!r}")
    return ToolCallDirective(name, args)


def _parse_sleep(line: str, rest: str) -> float:
    try:
        seconds = float(rest)
    except ValueError as exc:
        raise DirectiveError(f"echo: /sleep needs a number of seconds: {line!r}") from exc
    if not seconds >= 0:  # also rejects NaN
        raise DirectiveError(f"echo: /sleep needs a non-negative number: {line!r}")
    return seconds


def reply_without_tools(directives: Directives) -> str:
    """The answer to a message that calls no tool: its `/reply`, else the message itself."""
    if directives.reply is not None:
        return directives.reply
    return directives.text or _EMPTY_REPLY


def reply_after_tools(directives: Directives, tool_results: Sequence[str]) -> str:
    """The answer once tool results are back: the `/reply` text, else the results one per line."""
    if directives.reply is not None:
        return directives.reply
    return "\n".join(tool_results) or _EMPTY_REPLY


def count_words(texts: Iterable[str]) -> int:
    """Count whitespace-separated words, the echo model's stand-in for tokens."""
    return sum(len(text.split()) for text in texts)


class EchoModel(FunctionModel):
    """`builtin/echo` as a pydantic-ai model; see the module docstring for what it answers."""

    def __init__(self) -> None:
        counts = _MessageCounts()

        async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            return await _respond(messages, info, counts)

        super().__init__(respond, model_name=ECHO_MODEL_NAME)

    @property
    def system(self) -> str:
        """The provider half of the model reference."""
        return "builtin"

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: Any = None,
    ) -> AsyncIterator[StreamedResponse]:
        """Answer a streamed request in one piece, with the same usage as `request`."""
        response = await self.request(messages, model_settings, model_request_parameters)
        yield CompletedStreamedResponse(
            response, model_request_parameters=model_request_parameters, replay_events=True
        )


def echo_model() -> EchoModel:
    """Build the `builtin/echo` model (it holds no client, so instances are interchangeable)."""
    return EchoModel()


async def _respond(
    messages: list[ModelMessage], info: AgentInfo, counts: _MessageCounts
) -> ModelResponse:
    """The `FunctionModel` function: plan the answer to the latest request and time it."""
    input_words, calls_so_far = counts.total(messages)
    latest = messages[-1] if messages else None
    user_text = _latest_user_text(messages)
    try:
        directives = parse_directives(user_text or "")
    except DirectiveError as exc:
        raise ModelAPIError(ECHO_MODEL_NAME, str(exc)) from exc
    tool_results = _tool_results(latest)
    if isinstance(latest, ModelRequest) and not _has_user_prompt(latest) and tool_results:
        parts: list[ModelResponsePart] = [TextPart(reply_after_tools(directives, tool_results))]
    else:
        await asyncio.sleep(directives.sleep_s)
        if directives.fail is not None:
            raise ModelAPIError(ECHO_MODEL_NAME, directives.fail)
        parts = _first_answer(directives, calls_so_far)
    usage = RequestUsage(input_tokens=input_words, output_tokens=_output_words(parts))
    return ModelResponse(parts=parts, usage=usage, provider_name="builtin")


def _first_answer(directives: Directives, calls_so_far: int) -> list[ModelResponsePart]:
    if not directives.tool_calls:
        return [TextPart(reply_without_tools(directives))]
    return [
        ToolCallPart(call.name, dict(call.args), tool_call_id=f"echo_{calls_so_far + index}")
        for index, call in enumerate(directives.tool_calls, start=1)
    ]


def _has_user_prompt(request: ModelRequest) -> bool:
    return any(isinstance(part, UserPromptPart) for part in request.parts)


def _latest_user_text(messages: Sequence[ModelMessage]) -> str | None:
    for message in reversed(messages):
        if not isinstance(message, ModelRequest):
            continue
        prompts = [part for part in message.parts if isinstance(part, UserPromptPart)]
        if prompts:
            return _prompt_text(prompts[-1])
    return None


def _prompt_text(part: UserPromptPart) -> str:
    if isinstance(part.content, str):
        return part.content
    texts = [
        item if isinstance(item, str) else item.content
        for item in part.content
        if isinstance(item, str | TextContent)
    ]
    return "\n".join(texts)


def _tool_results(message: ModelMessage | None) -> list[str]:
    if not isinstance(message, ModelRequest):
        return []
    results: list[str] = []
    for part in message.parts:
        if isinstance(part, ToolReturnPart):
            results.append("null" if part.content is None else part.model_response_str())
    return results


class _MessageCounts:
    """The words and tool calls of each message a model was sent, counted once per message
    object and forgotten with it (a weak reference's callback)."""

    def __init__(self) -> None:
        self._counted: dict[int, tuple[int, int]] = {}

    def total(self, messages: Sequence[ModelMessage]) -> tuple[int, int]:
        """The words and the tool calls of all ``messages``."""
        words = calls = 0
        for message in messages:
            counted = self._counted.get(id(message))
            if counted is None:
                counted = self._count(message)
            words += counted[0]
            calls += counted[1]
        return words, calls

    def _count(self, message: ModelMessage) -> tuple[int, int]:
        calls = 0
        if isinstance(message, ModelResponse):
            calls = sum(isinstance(part, ToolCallPart) for part in message.parts)
        counted = self._counted[id(message)] = (count_words(_message_texts((message,))), calls)
        weakref.finalize(message, self._counted.pop, id(message), None)
        return counted


def _message_texts(messages: Sequence[ModelMessage]) -> Iterable[str]:
    for message in messages:
        if isinstance(message, ModelResponse):
            yield from _part_texts(message.parts)
            continue
        for part in message.parts:
            if isinstance(part, UserPromptPart):
                yield _prompt_text(part)
            elif isinstance(part, SystemPromptPart):
                yield part.content
            elif isinstance(part, ToolReturnPart):
                yield part.model_response_str()


def _output_words(parts: Sequence[ModelResponsePart]) -> int:
    return count_words(_part_texts(parts))


def _part_texts(parts: Sequence[ModelResponsePart]) -> Iterable[str]:
    for part in parts:
        if isinstance(part, TextPart | ThinkingPart):
            yield part.content
        elif isinstance(part, ToolCallPart):
            yield f"{part.tool_name} {part.args_as_json_str()}"
