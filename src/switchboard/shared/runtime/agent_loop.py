"""One agent run's model loop, on pydantic-ai's direct model API.

A run asks the model, executes the tool calls of its answer, asks again with the results,
and ends at the first answer without tool calls. It is built on pydantic-ai's public
model layer (`pydantic_ai.direct.model_request`, its message parts and tool definitions),
not on `Agent.run`: the model clients, the message format, the transcripts and the retry
feedback the model sees are pydantic-ai's, but the run costs one request per step instead
of an agent graph per run. Measured on the echo model: `Agent.run` costs about 5 ms of CPU
per run here, a `model_request` 0.2 ms; a session send runs two agent runs (the target's
turn and its announce step), a batch spawn one per child.

Matches `Agent.run(output_type=[str, DeferredToolRequests])` where the product relies on it:

- an answer with text and no tool calls ends the run with that text;
- an unknown tool, or arguments that are not a JSON object, go back to the model as a
  retried tool return (`outcome='retried'`) and a tool that keeps failing so ends the run
  with pydantic-ai's `UnexpectedModelBehavior`; an empty answer gets pydantic-ai's
  "Please return text or call a tool." feedback;
- a tool that must wait (`WaitFor`) defers its call: once the answer's other calls are
  executed the run ends with `DeferredToolRequests`, and a later run resumes with the results
  (`tool_results`), which join the trailing request of the history as pydantic-ai does;
- at most `REQUEST_LIMIT` model requests per run (pydantic-ai's default limit).

A tool may end the turn (`EndTurn`, raised by `sessions_yield`): once the answer's other
calls are executed, the run ends with `TurnEnded` (the call's result is its tool return)
instead of asking the model again. A deferred call in the same answer wins: the run parks,
and the ending call's return says the turn could not end (`TURN_NOT_ENDED`).

Tool calls of one answer run one after another, in the order the model made them, off the
run's event loop (`off_loop`): a handler is blocking code, and the loop's other runs go on
meanwhile.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.direct import model_request
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    RetryFeedbackCause,
    RetryFeedbackPart,
    RetryInfo,
    ToolCallPart,
    ToolRetryCause,
    ToolReturnPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.tools import DeferredToolRequests, ToolDefinition
from pydantic_ai.usage import RunUsage

from switchboard import telemetry
from switchboard.shared.errors import StoreUnavailable, SwitchboardError
from switchboard.shared.runtime.models import model_slots
from switchboard.shared.runtime.off_loop import off_loop
from switchboard.shared.services import ToolContext, ToolSpec, WaitFor

__all__ = ["MAX_RETRIES", "REQUEST_LIMIT", "EndTurn", "RunResult", "TurnEnded", "run_model_loop"]

# pydantic-ai's defaults: requests per run, and retries per tool (and for an empty answer).
REQUEST_LIMIT = 50
MAX_RETRIES = 1
_NO_OUTPUT = "Please return text or call a tool."

_ARGS = TypeAdapter(dict[str, Any])
# The return of a call that asked to end the turn when another call of its answer waits.
TURN_NOT_ENDED = {
    "status": "error",
    "error": "the turn cannot end while another call of the same answer waits for its result",
}


class EndTurn(Exception):
    """Raised by a tool handler to end the run after this answer's calls.

    ``result`` is the call's tool return; ``session_fields`` are written on the session
    in the step that ends the run."""

    def __init__(
        self, result: Mapping[str, Any], *, session_fields: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(result.get("status"))
        self.result = dict(result)
        self.session_fields = dict(session_fields or {})


@dataclass(frozen=True)
class TurnEnded:
    """The output of a run a tool ended (`EndTurn`): what the model said with the call."""

    text: str | None
    result: Mapping[str, Any]
    session_fields: Mapping[str, Any]


@dataclass
class RunResult:
    """A finished model loop: its output, the messages it added, and its usage."""

    output: str | DeferredToolRequests | TurnEnded
    messages: list[ModelMessage]
    usage: RunUsage = field(default_factory=RunUsage)

    def new_messages(self) -> list[ModelMessage]:
        """The messages this run added (requests and responses), in order."""
        return self.messages


# What a call that must wait leaves for parking: WaitFor → the call's metadata.
DeferralOf = Callable[[WaitFor], dict[str, Any]]


async def run_model_loop(
    model: Model,
    *,
    specs: Sequence[ToolSpec],
    ctx: ToolContext,
    history: Sequence[ModelMessage],
    instructions: str | None,
    defer: DeferralOf,
    tool_results: Sequence[ToolReturnPart] = (),
    before_tools: Callable[[], None] | None = None,
) -> RunResult:
    """Run the model on ``history`` with these tools until it answers without tool calls.

    ``tool_results`` resume a run that deferred calls: they answer those calls first.
    ``before_tools`` is called before each answer's tool calls execute (it raises to stop
    the run there: the executor's attempt fence)."""
    tools = _toolbox(specs)
    messages = list(history)
    new: list[ModelMessage] = []
    if tool_results:
        resumed = ModelRequest(parts=list(tool_results), instructions=instructions)
        new.append(resumed)
        if messages and isinstance(messages[-1], ModelRequest):
            last = messages[-1]
            messages[-1] = replace(last, parts=[*last.parts, *tool_results])
        else:
            messages.append(resumed)
    if not messages:
        raise UserError("the run has no message to answer")
    usage = RunUsage()
    retries: dict[str, int] = {}
    for _ in range(REQUEST_LIMIT):
        messages[-1] = _with_instructions(messages[-1], instructions)
        async with model_slots():
            with telemetry.model_call(model) as call:  # a `chat` span when tracing is on
                response = await model_request(
                    model, messages, model_request_parameters=tools.params, instrument=False
                )
                call.usage(response.usage)
        usage.incr(response.usage)
        usage.requests += 1
        messages.append(response)
        new.append(response)
        calls = response.tool_calls
        if not calls:
            if response.text:
                return RunResult(output=response.text, messages=new, usage=usage)
            request = ModelRequest(parts=[_no_output_feedback(retries)], instructions=instructions)
        else:
            # Off the loop: a handler is blocking code (store round trips, a registered
            # tool's own work) and would hold up every other run of the process meanwhile.
            parts, deferred, ended = await off_loop(
                partial(_call_tools, tools, ctx, calls, retries, defer, usage, before_tools)
            )
            if deferred.calls or ended is not None:
                if parts:
                    new.append(ModelRequest(parts=parts))
                if deferred.calls:
                    return RunResult(output=deferred, messages=new, usage=usage)
                assert ended is not None
                output = TurnEnded(response.text or None, ended.result, ended.session_fields)
                return RunResult(output=output, messages=new, usage=usage)
            request = ModelRequest(parts=parts, instructions=instructions)
        messages.append(request)
        new.append(request)
    raise UsageLimitExceeded(f"The next request would exceed the request_limit of {REQUEST_LIMIT}")


def _with_instructions(message: ModelMessage, instructions: str | None) -> ModelMessage:
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


def _call_tools(
    tools: _Toolbox,
    ctx: ToolContext,
    calls: Sequence[ToolCallPart],
    retries: dict[str, int],
    defer: DeferralOf,
    usage: RunUsage,
    before_tools: Callable[[], None] | None = None,
) -> tuple[list[ModelRequestPart], DeferredToolRequests, EndTurn | None]:
    """Execute an answer's calls (``before_tools`` first): their returns, the calls that
    must wait, and the end of the turn a call asked for (the first one)."""
    if before_tools is not None:
        before_tools()
    parts: list[ModelRequestPart] = []
    deferred = DeferredToolRequests()
    ended: EndTurn | None = None
    ending: set[str] = set()
    for call in calls:
        spec = tools.specs.get(call.tool_name)
        if spec is None:
            text = f"Unknown tool name: {call.tool_name!r}. {tools.available}"
            parts.append(_retried(call, text, "unknown_tool", retries))
            continue
        try:
            arguments = _arguments(call)
        except ValidationError as exc:
            content = [
                {**error, "loc": list(error["loc"])}  # as pydantic-ai sends it: a JSON list
                for error in exc.errors(include_url=False, include_context=False)
            ]
            parts.append(_retried(call, content, "validation_error", retries))
            continue
        usage.tool_calls += 1
        try:
            result: Any = spec.handler(ctx, arguments)
        except WaitFor as wait:
            deferred.calls.append(call)
            deferred.metadata[call.tool_call_id] = defer(wait)
            deferred.validated_args[call.tool_call_id] = arguments
            continue
        except EndTurn as end:
            ended = ended or end
            ending.add(call.tool_call_id)
            result = end.result
        except StoreUnavailable:
            raise  # the store is away: retried, not an outcome
        except SwitchboardError as exc:
            result = {"status": "error", "tool": spec.name, "error": exc.message}
        parts.append(
            ToolReturnPart(tool_name=call.tool_name, content=result, tool_call_id=call.tool_call_id)
        )
    if ended is not None and deferred.calls:  # parking wins: the turn goes on once resumed
        parts = [_not_ended(p, ending) for p in parts]
        ended = None
    return parts, deferred, ended


def _not_ended(part: ModelRequestPart, ending: set[str]) -> ModelRequestPart:
    """The return of a call in ``ending`` says the turn did not end; others as they are."""
    if not isinstance(part, ToolReturnPart) or part.tool_call_id not in ending:
        return part
    return ToolReturnPart(
        tool_name=part.tool_name, content=dict(TURN_NOT_ENDED), tool_call_id=part.tool_call_id
    )


def _arguments(call: ToolCallPart) -> dict[str, Any]:
    """The call's arguments as a JSON object (a `ValidationError` names what is wrong)."""
    args = call.args
    if args is None or args == "":
        return {}
    if isinstance(args, str):
        return _ARGS.validate_json(args)
    return _ARGS.validate_python(args)


def _retried(
    call: ToolCallPart,
    content: str | list[dict[str, Any]],
    cause: ToolRetryCause,
    retries: dict[str, int],
) -> ToolReturnPart:
    """The call's answer asking the model to try again, or the end of the run past the limit."""
    attempt = retries.get(call.tool_name, 0) + 1
    if attempt > MAX_RETRIES:
        raise UnexpectedModelBehavior(
            f"Tool {call.tool_name!r} exceeded max retries count of {MAX_RETRIES}"
        )
    retries[call.tool_name] = attempt
    return ToolReturnPart(
        tool_name=call.tool_name,
        content=content,
        tool_call_id=call.tool_call_id,
        outcome="retried",
        retry=RetryInfo(cause, attempt=attempt, max_retries=MAX_RETRIES),
    )


@dataclass(frozen=True)
class _Toolbox:
    """A set of tools as the model sees them, built once per set."""

    specs: Mapping[str, ToolSpec]
    params: ModelRequestParameters
    available: str


_TOOLBOXES: OrderedDict[tuple[int, ...], tuple[tuple[ToolSpec, ...], _Toolbox]] = OrderedDict()
_TOOLBOXES_SIZE = 64
_toolboxes_lock = threading.Lock()


def _toolbox(specs: Sequence[ToolSpec]) -> _Toolbox:
    key = tuple(id(s) for s in specs)
    with _toolboxes_lock:
        hit = _TOOLBOXES.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], specs, strict=True)):
            _TOOLBOXES.move_to_end(key)
            return hit[1]
    names = ", ".join(repr(n) for n in sorted(s.name for s in specs))
    box = _Toolbox(
        specs={s.name: s for s in specs},
        params=ModelRequestParameters(
            function_tools=[
                ToolDefinition(
                    name=s.name,
                    description=s.description,
                    parameters_json_schema=dict(s.parameters),
                )
                for s in specs
            ],
            allow_text_output=True,
        ),
        available=f"Available tools: {names}" if names else "No tools available.",
    )
    with _toolboxes_lock:
        _TOOLBOXES[key] = (tuple(specs), box)
        while len(_TOOLBOXES) > _TOOLBOXES_SIZE:
            _TOOLBOXES.popitem(last=False)
    return box
