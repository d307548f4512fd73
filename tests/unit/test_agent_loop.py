"""The run's model loop against pydantic-ai's `Agent.run`, on the same scripted model answers.

Each case scripts a model's answers, runs them once through `run_model_loop` and once
through an `Agent(output_type=[str, DeferredToolRequests])` with the same tools, and
compares what the model was sent at every step, the run's output, its new messages and its
usage. Where pydantic-ai itself fails (arguments that are a JSON array), the loop's answer
is checked on its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, cast

import pytest
from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import CallDeferred, UnexpectedModelBehavior, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, Tool

from switchboard.shared.errors import InvalidInput
from switchboard.shared.runtime import agent_loop
from switchboard.shared.runtime.agent_loop import RunResult, run_model_loop
from switchboard.shared.tools.registry import ToolContext, ToolSpec, WaitFor

pytestmark = pytest.mark.unit

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}
INSTRUCTIONS = "be brief"
CTX = ToolContext(services=cast(Any, None), session_key="agent:main:main", agent_id="main")


def _echo(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"got": args}


def _refuse(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    raise InvalidInput("x must be small", field="x")


def _wait(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    raise WaitFor("run-1", 30, {"why": "waiting"})


SPECS = [
    ToolSpec("echo", "Echo the arguments.", SCHEMA, _echo),
    ToolSpec("refuse", "Always refuses.", SCHEMA, _refuse),
    ToolSpec("wait", "Waits on another run.", SCHEMA, _wait),
]


class Scripted:
    """A FunctionModel answering from a script and recording every request it is sent."""

    def __init__(self, *answers: list[Any]) -> None:
        self.answers = list(answers)
        self.sent: list[list[ModelMessage]] = []
        self.tools: list[list[str]] = []
        self.model = FunctionModel(self._answer, model_name="scripted")

    def _answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.sent.append(list(messages))
        self.tools.append([t.name for t in info.function_tools])
        return ModelResponse(parts=self.answers.pop(0))


def _agent() -> Agent[ToolContext, Any]:
    def tool(spec: ToolSpec) -> Tool[ToolContext]:
        def call(run_ctx: RunContext[ToolContext], **arguments: Any) -> Any:
            try:
                return spec.handler(run_ctx.deps, arguments)
            except WaitFor as wait:
                raise CallDeferred(metadata={"targetRunId": wait.target_run_id}) from None
            except InvalidInput as exc:
                return {"status": "error", "tool": spec.name, "error": exc.message}

        return Tool.from_schema(
            call, name=spec.name, description=spec.description, json_schema=SCHEMA, takes_ctx=True
        )

    return Agent(output_type=[str, DeferredToolRequests], tools=[tool(s) for s in SPECS])


def _shape(messages: Sequence[ModelMessage]) -> list[Any]:
    """Messages without ids or timestamps: what the model reads."""
    out: list[Any] = []
    for m in messages:
        parts: list[tuple[Any, ...]] = []
        for p in m.parts:
            if isinstance(p, ToolReturnPart):
                parts.append(("return", p.tool_name, p.tool_call_id, p.content, p.outcome))
            elif isinstance(p, ToolCallPart):
                parts.append(("call", p.tool_name, p.tool_call_id, p.args))
            elif isinstance(p, UserPromptPart | TextPart | ThinkingPart):
                parts.append((p.part_kind, p.content))
            else:
                parts.append((p.part_kind, getattr(p, "content", None)))
        instructions = m.instructions if isinstance(m, ModelRequest) else None
        out.append((m.kind, instructions, parts))
    return out


def _history() -> list[ModelMessage]:
    return [ModelRequest(parts=[UserPromptPart("go")])]


def _ours(script: Scripted, history: list[ModelMessage], **kw: Any) -> RunResult:
    return asyncio.run(
        run_model_loop(
            script.model,
            specs=SPECS,
            ctx=CTX,
            history=history,
            instructions=INSTRUCTIONS,
            defer=lambda wait: {"targetRunId": wait.target_run_id},
            **kw,
        )
    )


def _theirs(script: Scripted, history: list[ModelMessage], **kw: Any) -> Any:
    return asyncio.run(
        _agent().run(
            None,
            model=script.model,
            deps=CTX,
            message_history=history,
            instructions=INSTRUCTIONS,
            **kw,
        )
    )


def _both(*answers: list[Any]) -> tuple[Scripted, RunResult, Scripted, Any]:
    ours, theirs = Scripted(*answers), Scripted(*answers)
    return ours, _ours(ours, _history()), theirs, _theirs(theirs, _history())


def _same_run(ours: Scripted, mine: RunResult, theirs: Scripted, result: Any) -> None:
    assert [_shape(sent) for sent in ours.sent] == [_shape(sent) for sent in theirs.sent]
    assert ours.tools == theirs.tools == [["echo", "refuse", "wait"]] * len(ours.sent)
    assert mine.output == result.output
    assert _shape(mine.new_messages()) == _shape(result.new_messages())
    assert (mine.usage.input_tokens, mine.usage.output_tokens, mine.usage.requests) == (
        result.usage.input_tokens,
        result.usage.output_tokens,
        result.usage.requests,
    )


def test_a_text_answer_ends_the_run() -> None:
    _same_run(*_both([TextPart("hi")]))


def test_tool_calls_run_and_their_results_go_back() -> None:
    ours, mine, theirs, result = _both(
        [ToolCallPart("echo", {"x": 1}, tool_call_id="c1"), ToolCallPart("refuse", "{}", "c2")],
        [TextPart("done")],
    )
    _same_run(ours, mine, theirs, result)
    [request] = [m for m in mine.new_messages() if isinstance(m, ModelRequest)]
    assert [getattr(p, "content", None) for p in request.parts] == [
        {"got": {"x": 1}},
        {"status": "error", "tool": "refuse", "error": "x must be small"},
    ]


def test_text_beside_tool_calls_does_not_end_the_run() -> None:
    _same_run(
        *_both(
            [TextPart("let me look"), ToolCallPart("echo", {"x": 2}, tool_call_id="c1")],
            [TextPart("done")],
        )
    )


def test_an_unknown_tool_is_told_so_and_the_model_goes_on() -> None:
    ours, mine, theirs, result = _both(
        [ToolCallPart("nope", {}, tool_call_id="c1")], [TextPart("done")]
    )
    _same_run(ours, mine, theirs, result)
    retried = ours.sent[1][-1].parts[0]
    assert isinstance(retried, ToolReturnPart) and retried.outcome == "retried"
    assert retried.content == "Unknown tool name: 'nope'. Available tools: 'echo', 'refuse', 'wait'"


def test_arguments_that_are_not_json_get_one_retry() -> None:
    _same_run(*_both([ToolCallPart("echo", '{"x": 1,', tool_call_id="c1")], [TextPart("done")]))


def test_an_empty_answer_gets_pydantic_ais_feedback() -> None:
    _same_run(*_both([], [TextPart("done")]))


def test_a_tool_failing_past_its_retries_ends_the_run_with_pydantic_ais_error() -> None:
    answers = [[ToolCallPart("echo", "not json", tool_call_id=f"c{i}")] for i in range(3)]
    with pytest.raises(UnexpectedModelBehavior) as theirs:
        _theirs(Scripted(*answers), _history())
    with pytest.raises(UnexpectedModelBehavior) as ours:
        _ours(Scripted(*answers), _history())
    assert str(theirs.value).startswith(str(ours.value))
    assert str(ours.value) == "Tool 'echo' exceeded max retries count of 1"


def test_arguments_that_are_a_json_array_get_a_retry_naming_the_problem() -> None:
    """pydantic-ai's agent fails here with a TypeError; the loop asks the model again."""
    script = Scripted([ToolCallPart("echo", "[1, 2]", tool_call_id="c1")], [TextPart("done")])
    result = _ours(script, _history())
    assert result.output == "done"
    retried = script.sent[1][-1].parts[0]
    assert isinstance(retried, ToolReturnPart) and retried.outcome == "retried"
    assert cast(list[dict[str, Any]], retried.content)[0]["type"] == "dict_type"


def test_a_waiting_call_defers_after_the_others_run_and_resumes_like_the_agent() -> None:
    answer = [ToolCallPart("echo", {"x": 1}, tool_call_id="c1"), ToolCallPart("wait", {}, "c2")]
    ours, mine, theirs, result = _both(answer)
    _same_run(ours, mine, theirs, result)
    assert isinstance(mine.output, DeferredToolRequests)
    assert [c.tool_call_id for c in mine.output.calls] == ["c2"]
    assert mine.output.metadata == {"c2": {"targetRunId": "run-1"}}

    # Resume both from the same history with the waited-for result.
    history = [*_history(), *mine.new_messages()]
    reply = {"status": "ok", "reply": "pong"}
    ours2, theirs2 = Scripted([TextPart("after")]), Scripted([TextPart("after")])
    resumed = _ours(
        ours2,
        history,
        tool_results=[ToolReturnPart(tool_name="wait", content=reply, tool_call_id="c2")],
    )
    agent_resumed = _theirs(
        theirs2, history, deferred_tool_results=DeferredToolResults(calls={"c2": reply})
    )
    _same_run(ours2, resumed, theirs2, agent_resumed)
    # The waited-for result joins the request that holds the other call's result.
    assert [getattr(p, "tool_call_id", None) for p in ours2.sent[0][-1].parts] == ["c1", "c2"]


def test_the_request_limit_ends_a_run_that_never_stops_calling_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_loop, "REQUEST_LIMIT", 3)
    answers = [[ToolCallPart("echo", {"x": i}, tool_call_id=f"c{i}")] for i in range(5)]
    script = Scripted(*answers)
    with pytest.raises(Exception, match="request_limit of 3"):
        _ours(script, _history())
    assert len(script.sent) == 3


def test_a_run_with_nothing_to_answer_is_refused_before_any_request() -> None:
    script = Scripted([TextPart("never")])
    with pytest.raises(UserError, match="no message to answer"):
        _ours(script, [])
    assert script.sent == []


def test_a_tool_call_runs_off_the_loop_so_its_other_runs_go_on() -> None:
    """A handler is blocking code: while one run's tool blocks, another coroutine on the
    same loop keeps running (the worker keeps every run of its process on one loop)."""
    released = threading.Event()
    ticks_during_call: list[int] = []
    ticks = 0

    def blocking(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
        seen = ticks
        released.wait(5)
        ticks_during_call.append(ticks - seen)
        return {"done": True}

    async def other_run() -> None:
        nonlocal ticks
        while ticks < 3:  # the tool lets go once the loop has ticked this often
            await asyncio.sleep(0.01)
            ticks += 1
        released.set()

    script = Scripted(
        [ToolCallPart("block", {"x": 1}, tool_call_id="c1")], [TextPart("after the call")]
    )
    specs = [ToolSpec("block", "Blocks until released.", SCHEMA, blocking)]

    async def both() -> RunResult:
        run = asyncio.ensure_future(
            run_model_loop(
                script.model,
                specs=specs,
                ctx=CTX,
                history=_history(),
                instructions=None,
                defer=lambda wait: {},
            )
        )
        await other_run()
        return await run

    result = asyncio.run(both())
    assert result.output == "after the call"
    assert ticks_during_call and ticks_during_call[0] >= 1, "the loop stood still during the call"
