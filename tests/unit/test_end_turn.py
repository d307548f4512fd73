"""A tool that ends the turn (`EndTurn`, as `sessions_yield` does) in the run's model loop."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from switchboard.shared.runtime.agent_loop import EndTurn, RunResult, TurnEnded, run_model_loop
from switchboard.shared.runtime.toolset import TURN_NOT_ENDED, SpecToolset
from switchboard.shared.tools.registry import ToolContext, ToolSpec, WaitFor

pytestmark = pytest.mark.unit

SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
CTX = ToolContext(services=cast(Any, None), session_key="agent:main:main", agent_id="main")
CALLED: list[str] = []


def _echo(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    CALLED.append("echo")
    return {"got": args}


def _end(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    CALLED.append("end")
    raise EndTurn({"status": "yielded", "message": "m"}, session_fields={"yieldedAt": 1})


def _wait(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    raise WaitFor("run-1", 30, {})


SPECS = [
    ToolSpec("echo", "Echo.", SCHEMA, _echo),
    ToolSpec("end", "End the turn.", SCHEMA, _end),
    ToolSpec("wait", "Wait.", SCHEMA, _wait),
]


class Scripted:
    """A FunctionModel answering from a script, counting its requests."""

    def __init__(self, *answers: list[Any]) -> None:
        self.answers = list(answers)
        self.requests = 0
        self.model = FunctionModel(self._answer, model_name="scripted")

    def _answer(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        return ModelResponse(parts=self.answers.pop(0))


def _run(script: Scripted) -> RunResult:
    CALLED.clear()
    return asyncio.run(
        run_model_loop(
            script.model,
            tools=SpecToolset(SPECS),
            ctx=CTX,
            history=[ModelRequest(parts=[UserPromptPart("go")])],
            instructions=None,
            defer=lambda wait: {"targetRunId": wait.target_run_id},
        )
    )


def test_the_run_ends_after_the_answer_with_the_calls_result_as_its_return() -> None:
    """No second model request; the other calls of the answer still run, in order."""
    script = Scripted(
        [
            TextPart("spawned, now waiting"),
            ToolCallPart("end", {}, tool_call_id="c1"),
            ToolCallPart("echo", {}, tool_call_id="c2"),
        ],
        [TextPart("never asked")],
    )
    result = _run(script)
    assert script.requests == 1
    assert CALLED == ["end", "echo"]
    assert result.output == TurnEnded(
        "spawned, now waiting", {"status": "yielded", "message": "m"}, {"yieldedAt": 1}
    )
    request = result.new_messages()[-1]
    assert isinstance(request, ModelRequest)
    returns = [p for p in request.parts if isinstance(p, ToolReturnPart)]
    assert [(p.tool_call_id, p.content) for p in returns] == [
        ("c1", {"status": "yielded", "message": "m"}),
        ("c2", {"got": {}}),
    ]


def test_a_turn_ended_without_text_has_no_reply() -> None:
    """An answer that is only the ending call ends the turn with no text."""
    result = _run(Scripted([ToolCallPart("end", {}, tool_call_id="c1")]))
    assert isinstance(result.output, TurnEnded) and result.output.text is None


def test_a_deferred_call_in_the_same_answer_parks_the_run_instead() -> None:
    """Parking wins, and the ending call's return says the turn did not end."""
    script = Scripted(
        [ToolCallPart("end", {}, tool_call_id="c1"), ToolCallPart("wait", {}, tool_call_id="c2")]
    )
    result = _run(script)
    assert isinstance(result.output, DeferredToolRequests)
    assert [c.tool_call_id for c in result.output.calls] == ["c2"]
    [request] = [m for m in result.new_messages() if isinstance(m, ModelRequest)]
    [ended] = request.parts
    assert isinstance(ended, ToolReturnPart) and ended.tool_call_id == "c1"
    assert ended.content == TURN_NOT_ENDED
