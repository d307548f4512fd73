"""The bodies the OpenAI-compatible surfaces answer, built from a run: a `chat.completion`
and a Responses API `response`. Pure functions of the run's record, shared by the api
(which answers them over HTTP) and the batches (which write them to an output file)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from openai.types import CompletionUsage
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
)
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.responses import Response as OpenAIResponse
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)
from openai.types.responses.response_error import ResponseError
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import BaseModel

from switchboard.shared.store.responses import ResponseRecord
from switchboard.shared.store.runs import RunRecord

MODEL_PREFIX = "switchboard/"
RESPONSE_PREFIX = "resp_"


def model_id(agent_id: str) -> str:
    """The model name of an agent."""
    return f"{MODEL_PREFIX}{agent_id}"


@dataclass(frozen=True)
class Turn:
    """One request's identity in the answers it produces."""

    completion_id: str
    model: str
    created: int
    session_key: str
    run_id: str | None

    def headers(self) -> dict[str, str]:
        """Where the message went: the session key and the run id."""
        out = {"x-switchboard-session-key": self.session_key}
        if self.run_id:
            out["x-switchboard-run-id"] = self.run_id
        return out


def usage_of(rec: RunRecord | None) -> CompletionUsage | None:
    """The run's recorded token usage in OpenAI's terms, if it has one."""
    usage = rec.usage if rec is not None else {}
    if "input" not in usage and "output" not in usage:
        return None
    prompt = int(usage.get("input") or 0)
    completion = int(usage.get("output") or 0)
    total = int(usage.get("totalTokens") or prompt + completion)
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)


def completion(
    turn: Turn, reply: str, usage: CompletionUsage | None, calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A `chat.completion` object (with the client's tool ``calls``: `finish_reason`
    "tool_calls")."""
    message = ChatCompletionMessage(role="assistant", content=reply)
    if calls:
        message = ChatCompletionMessage(
            role="assistant", content=reply or None, tool_calls=chat_tool_calls(calls)
        )
    body = ChatCompletion(
        id=turn.completion_id,
        object="chat.completion",
        created=turn.created,
        model=turn.model,
        choices=[
            Choice(
                index=0,
                message=message,
                finish_reason="tool_calls" if calls else "stop",
                logprobs=None,
            )
        ],
        usage=usage,
    )
    return body.model_dump(mode="json", exclude_unset=True)


def chat_tool_calls(
    calls: Sequence[Mapping[str, Any]],
) -> list[ChatCompletionMessageFunctionToolCall]:
    """A run's client calls as a chat message's `tool_calls`."""
    return [
        ChatCompletionMessageFunctionToolCall(
            id=str(c["id"]),
            type="function",
            function=Function(name=str(c["name"]), arguments=str(c["arguments"])),
        )
        for c in calls
    ]


def function_call_items(
    calls: Sequence[Mapping[str, Any]], *, done: bool = True
) -> list[ResponseFunctionToolCall]:
    """A run's client calls as a response's `function_call` output items."""
    return [
        ResponseFunctionToolCall(
            type="function_call",
            id=f"fc_{c['id']}",
            call_id=str(c["id"]),
            name=str(c["name"]),
            arguments=str(c["arguments"]) if done else "",
            status="completed" if done else "in_progress",
        )
        for c in calls
    ]


ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued"]
_STATUS: dict[str, ResponseStatus] = {
    "queued": "queued",
    "running": "in_progress",
    "parked": "in_progress",
    "ok": "completed",
    "cancelled": "cancelled",
}


def status_of(rec: ResponseRecord, run: RunRecord | None) -> ResponseStatus:
    """The response's status: its run's, in OpenAI's words."""
    if rec.run_id is None:
        return "completed"  # answered without a run
    if run is None:
        return "queued"
    return _STATUS.get(run.status, "failed")


def failure_text(run: RunRecord) -> str:
    """Why a run that did not end `ok` failed, in words."""
    if run.status == "timeout":
        return f"the agent run timed out: {run.error or 'deadline passed'}"
    return f"the agent run failed: {run.error or 'unknown error'}"


def response_usage(run: RunRecord | None) -> ResponseUsage | None:
    """The run's recorded token usage in the Responses API's terms, if it has one."""
    usage = run.usage if run is not None else {}
    if "input" not in usage and "output" not in usage:
        return None
    given = int(usage.get("input") or 0)
    made = int(usage.get("output") or 0)
    return ResponseUsage(
        input_tokens=given,
        input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
        output_tokens=made,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=int(usage.get("totalTokens") or given + made),
    )


def message_id(rec: ResponseRecord) -> str:
    """The id of a response's output message."""
    return "msg_" + rec.response_id.removeprefix(RESPONSE_PREFIX)


def message_item(rec: ResponseRecord, text: str | None, done: bool) -> ResponseOutputMessage:
    """A response's output message (its text once done)."""
    content = [ResponseOutputText(type="output_text", text=text or "", annotations=[])]
    return ResponseOutputMessage(
        id=message_id(rec),
        type="message",
        role="assistant",
        status="completed" if done else "in_progress",
        content=content if done else [],
    )


def _output(
    rec: ResponseRecord, run: RunRecord | None, reply: str | None
) -> list[ResponseOutputItem]:
    """A completed response's output: its message, or the client's calls the run ended
    on (after what the model said with them, if anything)."""
    calls = run.tool_calls if run is not None else []
    if not calls:
        return [message_item(rec, reply, True)]
    said: list[ResponseOutputItem] = [message_item(rec, reply, True)] if reply else []
    return [*said, *function_call_items(calls)]


def response_object(
    rec: ResponseRecord, run: RunRecord | None, status: ResponseStatus | None = None
) -> OpenAIResponse:
    """The `response` object: its run's state (or ``status``, while it is being streamed)."""
    status = status or status_of(rec, run)
    done = status == "completed"
    error = None
    if status == "failed" and run is not None:
        error = ResponseError(code="server_error", message=failure_text(run))
    reply = rec.reply if rec.run_id is None else (run.reply if run is not None else None)
    ended = run.ended_at_ms if run is not None and run.ended_at_ms else None
    return OpenAIResponse(
        id=rec.response_id,
        object="response",
        created_at=rec.created_at_ms // 1000,
        completed_at=ended // 1000 if done and ended else None,
        model=model_id(rec.agent_id),
        status=status,
        background=rec.background,
        error=error,
        incomplete_details=None,
        instructions=rec.instructions,
        metadata=dict(rec.metadata),
        output=_output(rec, run, reply) if done else [],
        parallel_tool_calls=True,
        previous_response_id=rec.previous_response_id,
        temperature=None,
        text={"format": {"type": "text"}},
        tool_choice="auto",
        tools=[],
        top_p=None,
        truncation="disabled",
        usage=response_usage(run) if done else None,
    )


def as_json(obj: BaseModel) -> dict[str, Any]:
    """An SDK object as sent (only the fields given, `null`s included)."""
    out: dict[str, Any] = obj.model_dump(mode="json", exclude_unset=True)
    return out
