"""One agent run's model loop, on pydantic-ai's `Agent`.

A run asks the model, executes the tool calls of its answer, asks again with the results,
and ends at the first answer without tool calls: pydantic-ai's `Agent` with
``output_type=[str, DeferredToolRequests]``, driven node by node (`Agent.iter`). The model,
the instructions and the tools (a toolset, `toolset.SpecToolset`) are given per run; the
agent holds none of them, so one agent serves every run of the process.

- Unknown tools, arguments that are not a JSON object and empty answers go back to the
  model as pydantic-ai's retry feedback; past the retries the run fails, as it does past
  `REQUEST_LIMIT` requests.
- A tool that must wait (`WaitFor`) defers its call: once the answer's other calls are
  executed the run ends with `DeferredToolRequests`, and a later run resumes with the
  results (``tool_results``, pydantic-ai's `DeferredToolResults`), which join the request
  that holds the other calls' returns.
- A tool may end the turn (`EndTurn`, raised by `sessions_yield`): once the answer's other
  calls are executed, the run ends with `TurnEnded` (the call's result is its tool return)
  instead of asking the model again. A deferred call in the same answer wins: the run
  parks, and the ending call's return says the turn could not end (`TURN_NOT_ENDED`).
- ``before_tools`` runs before each answer's tool calls (the executor's attempt fence).
- Each model request waits for a slot of its loop (`model_slots`) and has its ``chat``
  span (tracing on).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.usage import RunUsage, UsageLimits

from switchboard import telemetry
from switchboard.shared.runtime.models import model_slots
from switchboard.shared.runtime.off_loop import off_loop
from switchboard.shared.runtime.toolset import TURN_NOT_ENDED, DeferralOf, EndTurn, ToolRun
from switchboard.shared.services import ToolContext

__all__ = ["REQUEST_LIMIT", "EndTurn", "RunResult", "TurnEnded", "run_model_loop"]

# pydantic-ai's default: model requests per run.
REQUEST_LIMIT = 50


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


@dataclass
class _ModelSlots(AbstractCapability[Any]):
    """Each model request waits for a slot of its loop (`model_slots`) and has its
    ``chat`` span (tracing on)."""

    async def wrap_model_request(
        self, ctx: RunContext[Any], *, request_context: Any, handler: Any
    ) -> ModelResponse:
        async with model_slots():
            with telemetry.model_call(request_context.model) as call:
                response: ModelResponse = await handler(request_context)
                call.usage(response.usage)
        return response


_AGENT: Agent[ToolRun, str | DeferredToolRequests] = Agent(
    output_type=[str, DeferredToolRequests],
    deps_type=ToolRun,
    capabilities=[_ModelSlots()],
    name="switchboard",
)


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
) -> RunResult:
    """Run the model on ``history`` with ``tools`` (a toolset) until it answers without
    tool calls.

    ``tool_results`` resume a run that deferred calls: they answer those calls first.
    ``before_tools`` is called (off the loop) before each answer's tool calls execute (it
    raises to stop the run there: the executor's attempt fence)."""
    if not history:
        raise UserError("the run has no message to answer")
    run = ToolRun(ctx, defer)
    answers = DeferredToolResults(calls={r.tool_call_id: r.content for r in tool_results})
    async with _AGENT.iter(
        None,
        model=model,
        deps=run,
        message_history=history,
        deferred_tool_results=answers if tool_results else None,
        instructions=instructions,
        toolsets=[tools],
        usage_limits=UsageLimits(request_limit=REQUEST_LIMIT),
    ) as agent_run:
        node = agent_run.next_node
        answered = bool(tool_results)  # the first answer's calls have their results
        while not Agent.is_end_node(node):
            if Agent.is_call_tools_node(node) and node.model_response.tool_calls:
                if before_tools is not None and not answered:
                    await off_loop(before_tools)
                answered = False
            node = await agent_run.next(node)
            if run.ended is not None and Agent.is_model_request_node(node):
                # The turn ends: the returns of the answer's calls are its last message.
                messages = [*agent_run.new_messages(), node.request]
                ended = TurnEnded(_said(messages), run.ended.result, run.ended.session_fields)
                return RunResult(output=ended, messages=messages, usage=agent_run.usage)
        result = agent_run.result
        assert result is not None
        messages = result.new_messages()
        if run.ending and isinstance(result.output, DeferredToolRequests):
            messages = [_not_ended(m, run.ending) for m in messages]
        return RunResult(output=result.output, messages=messages, usage=result.usage)


def _said(messages: Sequence[ModelMessage]) -> str | None:
    """The text of the last answer among ``messages`` (None: it had none)."""
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            return message.text or None
    return None


def _not_ended(message: ModelMessage, ending: set[str]) -> ModelMessage:
    """``message`` with the returns of the calls in ``ending`` saying the turn did not end
    (parking wins: the turn goes on once the run resumes)."""
    if not isinstance(message, ModelRequest):
        return message
    parts = [
        ToolReturnPart(p.tool_name, dict(TURN_NOT_ENDED), p.tool_call_id, timestamp=p.timestamp)
        if isinstance(p, ToolReturnPart) and p.tool_call_id in ending
        else p
        for p in message.parts
    ]
    return replace(message, parts=parts)
