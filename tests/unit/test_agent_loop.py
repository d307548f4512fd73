"""The run's model loop (`run_model_loop`) on scripted model answers: what the model is
sent, what the tools do, and what the run ends with."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryFeedbackPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from switchboard.shared.errors import InvalidInput, StoreUnavailable
from switchboard.shared.runtime import models
from switchboard.shared.runtime.agent_loop import REQUEST_LIMIT, RunResult, run_model_loop
from switchboard.shared.runtime.toolset import SpecToolset, toolset_for
from switchboard.shared.tools.registry import ToolContext, ToolSpec, WaitFor

pytestmark = pytest.mark.unit

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}
INSTRUCTIONS = "be brief"
CTX = ToolContext(services=cast(Any, None), session_key="agent:main:main", agent_id="main")
CALLED: list[str] = []


def _echo(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    CALLED.append("echo")
    return {"got": args}


def _refuse(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    raise InvalidInput("x must be small", field="x")


def _wait(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    CALLED.append("wait")
    raise WaitFor("run-1", 30, {"why": "waiting"})


def _store_away(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    raise StoreUnavailable("redis is away")


SPECS = [
    ToolSpec("echo", "Echo the arguments.", SCHEMA, _echo),
    ToolSpec("refuse", "Always refuses.", SCHEMA, _refuse),
    ToolSpec("wait", "Waits on another run.", SCHEMA, _wait),
    ToolSpec("store_away", "The store is away.", SCHEMA, _store_away),
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

    def last_parts(self, request: int = -1) -> list[Any]:
        """The parts of the last message of the ``request``-th request the model was sent."""
        return list(self.sent[request][-1].parts)


def _history() -> list[ModelMessage]:
    return [ModelRequest(parts=[UserPromptPart("go")])]


def _run(script: Scripted, history: list[ModelMessage] | None = None, **kw: Any) -> RunResult:
    CALLED.clear()
    kw.setdefault("tools", SpecToolset(SPECS))
    return asyncio.run(
        run_model_loop(
            script.model,
            ctx=CTX,
            history=_history() if history is None else history,
            instructions=INSTRUCTIONS,
            defer=lambda wait: {"targetRunId": wait.target_run_id},
            **kw,
        )
    )


def _returns(message: ModelMessage) -> list[tuple[str, Any, str]]:
    return [
        (p.tool_call_id, p.content, p.outcome)
        for p in message.parts
        if isinstance(p, ToolReturnPart)
    ]


def test_a_text_answer_ends_the_run_with_that_text() -> None:
    """One request, sent with the instructions and the tools; its text is the output."""
    script = Scripted([TextPart("hi")])
    result = _run(script)
    assert result.output == "hi"
    assert script.tools == [["echo", "refuse", "wait", "store_away"]]
    request = script.sent[0][-1]
    assert isinstance(request, ModelRequest) and request.instructions == INSTRUCTIONS
    assert [m.kind for m in result.new_messages()] == ["response"]
    assert (result.usage.requests, result.usage.output_tokens > 0) == (1, True)


def test_tool_calls_run_in_order_and_their_results_go_back() -> None:
    """An error a tool raises is its return, for the model to read."""
    script = Scripted(
        [
            ToolCallPart("echo", {"x": 1}, tool_call_id="c1"),
            ToolCallPart("refuse", "{}", tool_call_id="c2"),
        ],
        [TextPart("done")],
    )
    result = _run(script)
    assert result.output == "done"
    assert _returns(script.sent[1][-1]) == [
        ("c1", {"got": {"x": 1}}, "success"),
        ("c2", {"status": "error", "tool": "refuse", "error": "x must be small"}, "success"),
    ]
    assert [m.kind for m in result.new_messages()] == ["response", "request", "response"]
    assert (result.usage.requests, result.usage.tool_calls) == (2, 2)


def test_text_beside_tool_calls_does_not_end_the_run() -> None:
    """The model is asked again with the results."""
    script = Scripted(
        [TextPart("let me look"), ToolCallPart("echo", {"x": 2}, tool_call_id="c1")],
        [TextPart("done")],
    )
    assert _run(script).output == "done"
    assert len(script.sent) == 2


def test_an_unknown_tool_is_told_so_and_the_model_goes_on() -> None:
    """The call's return names the tools there are, as a retry."""
    script = Scripted([ToolCallPart("nope", {}, tool_call_id="c1")], [TextPart("done")])
    assert _run(script).output == "done"
    [retried] = script.last_parts(1)
    assert isinstance(retried, ToolReturnPart) and retried.outcome == "retried"
    assert "nope" in str(retried.content) and "'echo'" in str(retried.content)
    assert CALLED == []


@pytest.mark.parametrize("args", ['{"x": 1,', "[1, 2]", '{"x": "many"}'])
def test_arguments_that_are_not_a_json_object_get_a_retry(args: str) -> None:
    """Arguments are checked as a JSON object (a tool's handler checks its own fields)."""
    script = Scripted([ToolCallPart("echo", args, tool_call_id="c1")], [TextPart("done")])
    result = _run(script)
    assert result.output == "done"
    if args == '{"x": "many"}':
        assert CALLED == ["echo"]  # an object: the handler decides
        return
    [retried] = script.last_parts(1)
    assert isinstance(retried, ToolReturnPart) and retried.outcome == "retried"
    assert CALLED == []


def test_a_tool_failing_past_its_retries_ends_the_run() -> None:
    """Two bad calls in a row (one retry allowed) fail the run."""
    answers = [[ToolCallPart("echo", "not json", tool_call_id=f"c{i}")] for i in range(3)]
    with pytest.raises(UnexpectedModelBehavior, match="exceeded max retries"):
        _run(Scripted(*answers))


def test_an_empty_answer_is_asked_again() -> None:
    """The model is told to return text or call a tool."""
    script = Scripted([], [TextPart("done")])
    result = _run(script)
    assert result.output == "done"
    [feedback] = [p for m in result.new_messages() if isinstance(m, ModelRequest) for p in m.parts]
    assert isinstance(feedback, RetryFeedbackPart)
    assert "return text or call a tool" in str(script.last_parts(1)[0].content)


def test_a_waiting_call_defers_after_the_others_run_and_resumes() -> None:
    """The run ends with the waiting call and its parking metadata; the other call's return
    is kept, and the waited-for result joins it when the run resumes."""
    script = Scripted(
        [ToolCallPart("wait", {}, tool_call_id="c1"), ToolCallPart("echo", {"x": 1}, "c2")]
    )
    result = _run(script)
    assert CALLED == ["wait", "echo"]
    assert isinstance(result.output, DeferredToolRequests)
    assert [c.tool_call_id for c in result.output.calls] == ["c1"]
    assert result.output.metadata == {"c1": {"targetRunId": "run-1"}}
    assert [_returns(m) for m in result.new_messages() if isinstance(m, ModelRequest)] == [
        [("c2", {"got": {"x": 1}}, "success")]
    ]

    history = [*_history(), *result.new_messages()]
    reply = {"status": "ok", "reply": "pong"}
    resumed_script = Scripted([TextPart("after")])
    resumed = _run(
        resumed_script,
        history,
        tool_results=[ToolReturnPart(tool_name="wait", content=reply, tool_call_id="c1")],
    )
    assert resumed.output == "after"
    assert CALLED == []  # no call runs twice
    assert sorted(_returns(resumed_script.sent[0][-1])) == [
        ("c1", reply, "success"),
        ("c2", {"got": {"x": 1}}, "success"),
    ]
    assert [_returns(m) for m in resumed.new_messages() if isinstance(m, ModelRequest)] == [
        [("c1", reply, "success")]
    ]


def test_before_tools_runs_before_each_answers_calls_and_can_stop_the_run() -> None:
    """Once per answer with calls (not for a text answer); what it raises ends the run
    before any tool runs."""
    seen: list[list[str]] = []
    script = Scripted(
        [ToolCallPart("echo", {}, tool_call_id="c1")],
        [ToolCallPart("echo", {}, tool_call_id="c2")],
        [TextPart("done")],
    )
    assert _run(script, before_tools=lambda: seen.append(list(CALLED))).output == "done"
    assert seen == [[], ["echo"]]

    def fence() -> None:
        raise RuntimeError("superseded")

    with pytest.raises(RuntimeError, match="superseded"):
        _run(Scripted([ToolCallPart("echo", {}, tool_call_id="c1")]), before_tools=fence)
    assert CALLED == []


def test_a_store_outage_in_a_tool_ends_the_run_as_it_is() -> None:
    """`StoreUnavailable` is not a tool outcome: it propagates (the run is retried)."""
    with pytest.raises(StoreUnavailable):
        _run(Scripted([ToolCallPart("store_away", {}, tool_call_id="c1")]))


def test_the_request_limit_ends_a_run_that_never_stops_calling_tools() -> None:
    """At most `REQUEST_LIMIT` model requests per run."""
    answers = [[ToolCallPart("echo", {"x": i}, tool_call_id=f"c{i}")] for i in range(60)]
    script = Scripted(*answers)
    with pytest.raises(UsageLimitExceeded, match=f"request_limit of {REQUEST_LIMIT}"):
        _run(script)
    assert len(script.sent) == REQUEST_LIMIT


def test_a_run_with_nothing_to_answer_is_refused_before_any_request() -> None:
    """An empty history is a usage error, and the model is not asked."""
    script = Scripted([TextPart("never")])
    with pytest.raises(UserError, match="no message to answer"):
        _run(script, [])
    assert script.sent == []


def test_each_model_request_holds_a_slot_of_its_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request waits for one of its loop's `model_slots` and holds it while it runs."""
    monkeypatch.setattr(models, "MODEL_SLOTS_PER_LOOP", 1)
    held: list[bool] = []

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        held.append(models.model_slots().locked())
        return ModelResponse(parts=[TextPart("hi")])

    assert _run(cast(Any, type("S", (), {"model": FunctionModel(answer)}))).output == "hi"
    assert held == [True]


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
    tools = SpecToolset([ToolSpec("block", "Blocks until released.", SCHEMA, blocking)])

    async def both() -> RunResult:
        run = asyncio.ensure_future(
            run_model_loop(
                script.model,
                tools=tools,
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


def test_a_tool_set_is_built_once() -> None:
    """The same specs give the same toolset; other specs another one."""
    assert toolset_for(SPECS) is toolset_for(list(SPECS))
    assert toolset_for(SPECS[:2]) is not toolset_for(SPECS)
