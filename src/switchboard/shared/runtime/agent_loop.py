"""One agent run's model loop, on pydantic-ai's direct model API and its toolsets.

A run asks the model, executes the tool calls of its answer, asks again with the results,
and ends at the first answer without tool calls. The model clients, the message format,
the tools (a toolset: `toolset.SpecToolset`, its `get_tools` and `call_tool`) and the
deferral of a call (`CallDeferred`) are pydantic-ai's public API; the loop itself is not
pydantic-ai's `Agent`. Measured on the same runs, alternated (docs/performance.md), the
`Agent` (its graph, tasks and hooks) took about 5 ms more CPU per run with one request and
8 ms with a tool call, on the echo model as through the OpenAI client at 50 ms of latency;
this loop makes one `model_request` per step.

- An answer with text and no tool calls ends the run with that text.
- An unknown tool, or arguments its validator refuses, go back to the model as a retried
  tool return (``outcome='retried'``), and an empty answer as retry feedback; past the
  tool's retries (`MAX_RETRIES`) the run fails with `UnexpectedModelBehavior`, and past
  `REQUEST_LIMIT` requests with `UsageLimitExceeded`.
- A tool that must wait defers its call (`CallDeferred`): once the answer's other calls are
  executed the run ends with `DeferredToolRequests`, and a later run resumes with the
  results (``tool_results``), which join the trailing request of the history. A call of
  an external tool (pydantic-ai's `ExternalToolset`: a client's tool,
  `runtime.client_tools`) is deferred so, without being executed here.
- A tool may end the turn (`EndTurn`, raised by `sessions_yield`): once the answer's other
  calls are executed, the run ends with `TurnEnded` (the call's result is its tool return)
  instead of asking the model again. A deferred call in the same answer wins: the run
  parks, and the ending call's return says the turn could not end (`TURN_NOT_ENDED`).
- ``before_tools`` runs (off the loop) before each answer's tool calls: the executor's
  attempt fence.
- Messages steered into the run (`steering.Steering`) join the request after a step's
  tool returns (one look at the session's steer inbox per step that called tools), and
  the first request when the run starts with some waiting.
- Each model request waits for a slot of its loop (`model_slots`) and has its ``chat``
  span (tracing on).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError
from pydantic_ai import RunContext
from pydantic_ai.direct import model_request
from pydantic_ai.exceptions import (
    CallDeferred,
    UnexpectedModelBehavior,
    UsageLimitExceeded,
    UserError,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    RetryFeedbackCause,
    RetryFeedbackPart,
    RetryInfo,
    ToolCallPart,
    ToolRetryCause,
    ToolReturn,
    ToolReturnPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.usage import RunUsage

from switchboard import telemetry
from switchboard.shared.runtime.models import model_slots
from switchboard.shared.runtime.off_loop import off_loop
from switchboard.shared.runtime.steering import Steering
from switchboard.shared.runtime.toolset import (
    MAX_RETRIES,
    TURN_NOT_ENDED,
    DeferralOf,
    EndTurn,
    ToolRun,
)
from switchboard.shared.services import ToolContext

__all__ = ["REQUEST_LIMIT", "EndTurn", "RunResult", "TurnEnded", "run_model_loop"]

# Model requests per run (pydantic-ai's default limit).
REQUEST_LIMIT = 50
_NO_OUTPUT = "Please return text or call a tool."

Tools = dict[str, ToolsetTool[ToolRun]]


@dataclass(frozen=True)
class TurnEnded:
    """The output of a run a tool ended (`EndTurn`): what the model said with the call
    (or the tool's reply), and whether the run is paused (waiting for its children)."""

    text: str | None
    result: Mapping[str, Any]
    session_fields: Mapping[str, Any]
    paused: bool = True


@dataclass
class RunResult:
    """A finished model loop: its output, the messages it added, and its usage."""

    output: str | DeferredToolRequests | TurnEnded
    messages: list[ModelMessage]
    usage: RunUsage = field(default_factory=RunUsage)
    # The messages of the session's steer inbox the run took (`steering.Steering`).
    steered: Sequence[Mapping[str, Any]] = ()

    @property
    def steer_taken(self) -> int:
        """How many messages of the session's steer inbox the run took."""
        return len(self.steered)

    def new_messages(self) -> list[ModelMessage]:
        """The messages this run added (requests and responses), in order."""
        return self.messages


async def run_model_loop(
    model: Model,
    *,
    tools: AbstractToolset[ToolRun],
    ctx: ToolContext,
    history: Sequence[ModelMessage],
    instructions: str | None,
    defer: DeferralOf,
    tool_results: Sequence[ToolReturnPart] = (),
    before_tools: Callable[[], None] | None = None,
    model_settings: ModelSettings | None = None,
    steering: Steering | None = None,
) -> RunResult:
    """Run the model on ``history`` with ``tools`` until it answers without tool calls.

    ``tool_results`` resume a run that deferred calls: they answer those calls first.
    ``before_tools`` is called (off the loop) before each answer's tool calls execute (it
    raises to stop the run there: the executor's attempt fence). ``model_settings`` go
    with every model request (a client's tool choice). ``steering``: where messages
    steered into the run come from."""
    messages, new = _resumed(history, tool_results, instructions)
    if steering is not None and (steering.carried or steering.look_first):
        steered = await off_loop(steering.first)
        if steered:
            request = ModelRequest(parts=steered, instructions=instructions)
            messages.append(request)
            new.append(request)
    if not messages:
        raise UserError("the run has no message to answer")
    run = ToolRun(ctx, defer)
    usage = RunUsage()
    run_ctx = RunContext(deps=run, model=model, usage=usage)
    retries: dict[str, int] = {}
    async with tools:
        available = await tools.get_tools(run_ctx)
        params = ModelRequestParameters(
            function_tools=[t.tool_def for t in available.values()], allow_text_output=True
        )
        for _ in range(REQUEST_LIMIT):
            messages[-1] = _with_instructions(messages[-1], instructions)
            async with model_slots():
                with telemetry.model_call(model) as call:  # a `chat` span when tracing is on
                    response = await model_request(
                        model,
                        messages,
                        model_settings=model_settings,
                        model_request_parameters=params,
                        instrument=False,
                    )
                    call.usage(response.usage)
            usage.incr(response.usage)
            usage.requests += 1
            messages.append(response)
            new.append(response)
            if not response.tool_calls:
                if response.text:
                    return _result(response.text, new, usage, steering)
                feedback = _no_output_feedback(retries)
                request = ModelRequest(parts=[feedback], instructions=instructions)
            else:
                if before_tools is not None:
                    await off_loop(before_tools)
                parts, deferred = await _call_tools(tools, available, run_ctx, response, retries)
                if deferred.calls or run.ended is not None:
                    if parts:
                        new.append(ModelRequest(parts=parts))
                    if deferred.calls:
                        return _result(deferred, new, usage, steering)
                    assert run.ended is not None
                    end = run.ended
                    text = end.reply or response.text or None
                    output = TurnEnded(text, end.result, end.session_fields, end.paused)
                    return _result(output, new, usage, steering)
                if steering is not None:  # what was steered in while the tools ran
                    parts = [*parts, *await off_loop(steering.take)]
                request = ModelRequest(parts=parts, instructions=instructions)
            messages.append(request)
            new.append(request)
    raise UsageLimitExceeded(f"The next request would exceed the request_limit of {REQUEST_LIMIT}")


def _result(
    output: str | DeferredToolRequests | TurnEnded,
    new: list[ModelMessage],
    usage: RunUsage,
    steering: Steering | None,
) -> RunResult:
    steered = list(steering.took) if steering is not None else []
    return RunResult(output=output, messages=new, usage=usage, steered=steered)


def _resumed(
    history: Sequence[ModelMessage],
    tool_results: Sequence[ToolReturnPart],
    instructions: str | None,
) -> tuple[list[ModelMessage], list[ModelMessage]]:
    """The messages to send first and the run's new messages so far: the results of a
    resumed run join the history's trailing request (the other calls' returns)."""
    messages = list(history)
    if not tool_results:
        return messages, []
    resumed = ModelRequest(parts=list(tool_results), instructions=instructions)
    if messages and isinstance(messages[-1], ModelRequest):
        last = messages[-1]
        messages[-1] = replace(last, parts=[*last.parts, *tool_results])
    else:
        messages.append(resumed)
    return messages, [resumed]


def _with_instructions(message: ModelMessage, instructions: str | None) -> ModelMessage:
    """``message`` carrying the run's instructions (a copy: history messages are shared)."""
    if not isinstance(message, ModelRequest) or message.instructions == instructions:
        return message
    return replace(message, instructions=instructions)


def _no_output_feedback(retries: dict[str, int]) -> RetryFeedbackPart:
    attempt = retries.get("", 0) + 1
    if attempt > MAX_RETRIES:
        raise UnexpectedModelBehavior(
            f"Exceeded maximum retries ({MAX_RETRIES}) for output validation"
        )
    retries[""] = attempt
    info: RetryInfo[RetryFeedbackCause] = RetryInfo(
        "no_output", attempt=attempt, max_retries=MAX_RETRIES
    )
    return RetryFeedbackPart(content=_NO_OUTPUT, retry=info)


async def _call_tools(
    tools: AbstractToolset[ToolRun],
    available: Tools,
    run_ctx: RunContext[ToolRun],
    response: ModelResponse,
    retries: dict[str, int],
) -> tuple[list[ModelRequestPart], DeferredToolRequests]:
    """Execute an answer's calls one after another: their returns, and the calls that
    must wait. A call that ended the turn has its return say it did not, if one waits."""
    parts: list[ModelRequestPart] = []
    deferred = DeferredToolRequests()
    for call in response.tool_calls:
        tool = available.get(call.tool_name)
        if tool is None:
            text = f"Unknown tool name: {call.tool_name!r}. {_names(available)}"
            parts.append(_retried(call, text, "unknown_tool", MAX_RETRIES, retries))
            continue
        try:
            arguments = _arguments(tool, call)
        except ValidationError as exc:
            errors = [
                {**error, "loc": list(error["loc"])}  # as pydantic-ai sends it: a JSON list
                for error in exc.errors(include_url=False, include_context=False)
            ]
            parts.append(_retried(call, errors, "validation_error", tool.max_retries, retries))
            continue
        if tool.tool_def.kind == "external":  # executed elsewhere (the client): deferred
            deferred.calls.append(call)
            deferred.metadata[call.tool_call_id] = {"external": True}
            deferred.validated_args[call.tool_call_id] = arguments
            continue
        run_ctx.usage.tool_calls += 1
        call_ctx = replace(run_ctx, tool_call_id=call.tool_call_id, tool_name=call.tool_name)
        try:
            result = await tools.call_tool(call.tool_name, arguments, call_ctx, tool)
        except CallDeferred as wait:
            deferred.calls.append(call)
            deferred.metadata[call.tool_call_id] = wait.metadata or {}
            deferred.validated_args[call.tool_call_id] = arguments
            continue
        parts.append(_returned(call, result))
    run = run_ctx.deps
    if run.ended is not None and deferred.calls:  # parking wins: the turn goes on once resumed
        parts = [_not_ended(p, run.ending) for p in parts]
        run.ended = None
    return parts, deferred


def _returned(call: ToolCallPart, result: Any) -> ToolReturnPart:
    """A call's return; a `ToolReturn` (MCP and Python tools) carries its call record
    (``metadata['call']``, kept in the transcript) and says whether the call failed."""
    if not isinstance(result, ToolReturn):
        return ToolReturnPart(
            tool_name=call.tool_name, content=result, tool_call_id=call.tool_call_id
        )
    record = (result.metadata or {}).get("call") or {}
    return ToolReturnPart(
        tool_name=call.tool_name,
        content=result.return_value,
        tool_call_id=call.tool_call_id,
        metadata=result.metadata,
        outcome="success" if record.get("outcome", "ok") == "ok" else "failed",
    )


def _not_ended(part: ModelRequestPart, ending: set[str]) -> ModelRequestPart:
    """The return of a call in ``ending`` says the turn did not end; others as they are."""
    if not isinstance(part, ToolReturnPart) or part.tool_call_id not in ending:
        return part
    return ToolReturnPart(
        tool_name=part.tool_name, content=dict(TURN_NOT_ENDED), tool_call_id=part.tool_call_id
    )


def _names(available: Tools) -> str:
    names = ", ".join(repr(n) for n in sorted(available))
    return f"Available tools: {names}" if names else "No tools available."


def _arguments(tool: ToolsetTool[ToolRun], call: ToolCallPart) -> dict[str, Any]:
    """The call's arguments as the tool's validator makes them (a `ValidationError`
    names what is wrong)."""
    args = call.args
    if args is None or args == "":
        args = {}
    validator = tool.args_validator
    valid: dict[str, Any] = (
        validator.validate_json(args) if isinstance(args, str) else validator.validate_python(args)
    )
    return valid


def _retried(
    call: ToolCallPart,
    content: str | list[dict[str, Any]],
    cause: ToolRetryCause,
    max_retries: int,
    retries: dict[str, int],
) -> ToolReturnPart:
    """The call's answer asking the model to try again, or the end of the run past the limit."""
    attempt = retries.get(call.tool_name, 0) + 1
    if attempt > max_retries:
        raise UnexpectedModelBehavior(
            f"Tool {call.tool_name!r} exceeded max retries count of {max_retries}"
        )
    retries[call.tool_name] = attempt
    return ToolReturnPart(
        tool_name=call.tool_name,
        content=content,
        tool_call_id=call.tool_call_id,
        outcome="retried",
        retry=RetryInfo(cause, attempt=attempt, max_retries=max_retries),
    )
