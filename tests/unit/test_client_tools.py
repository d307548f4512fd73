"""Client-side tools in the run's model loop and their checks (`runtime.client_tools`)."""

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
from pydantic_ai.toolsets import CombinedToolset

from switchboard.shared.errors import InvalidInput
from switchboard.shared.runtime.agent_loop import RunResult, run_model_loop
from switchboard.shared.runtime.client_tools import (
    NO_RESULT,
    NOT_AWAITED,
    answer_left_calls,
    check_client_tools,
    client_calls,
    client_toolset,
    tool_returns,
    tool_settings,
)
from switchboard.shared.runtime.toolset import SpecToolset
from switchboard.shared.tools.registry import ToolContext, ToolSpec, WaitFor

pytestmark = pytest.mark.unit

CTX = ToolContext(services=cast(Any, None), session_key="agent:main:main", agent_id="main")
WEATHER = {
    "name": "get_weather",
    "description": "The weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
EXECUTED: list[str] = []


def _own(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    EXECUTED.append("own")
    return {"ok": True}


def _wait(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    raise WaitFor("run-1", 30, {})


SPECS = [
    ToolSpec("own", "The agent's own tool.", {"type": "object"}, _own),
    ToolSpec("wait", "Waits on another run.", {"type": "object"}, _wait),
]


def _run(parts: list[Any], choice: Any = None) -> tuple[RunResult, list[list[str]]]:
    """One run answering ``parts`` first, then "done"; the tool names each request offered."""
    offered: list[list[str]] = []
    answers = [parts, [TextPart("done")]]

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered.append([t.name for t in info.function_tools])
        return ModelResponse(parts=answers.pop(0))

    client = client_toolset([WEATHER], choice)
    tools: Any = SpecToolset(SPECS)
    if client is not None:
        tools = CombinedToolset([tools, client])
    EXECUTED.clear()
    result = asyncio.run(
        run_model_loop(
            FunctionModel(answer, model_name="scripted"),
            tools=tools,
            ctx=CTX,
            history=[ModelRequest(parts=[UserPromptPart("go")])],
            instructions=None,
            defer=lambda wait: {"targetRunId": wait.target_run_id},
            model_settings=tool_settings(choice),
        )
    )
    return result, offered


def test_a_client_tool_call_ends_the_run_without_being_executed() -> None:
    """The model is offered the client's tool beside the agent's; its call is deferred (the
    agent's own call in the same answer runs), and is the client's to execute."""
    call = ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id="c1")
    result, offered = _run([ToolCallPart("own", {}, tool_call_id="c0"), call])
    assert offered == [["own", "wait", "get_weather"]]
    assert EXECUTED == ["own"]
    assert isinstance(result.output, DeferredToolRequests)
    calls, others = client_calls(result.output)
    assert [c.to_json() for c in calls] == [
        {"id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
    ]
    assert others == []


def test_a_waiting_call_beside_a_client_call_is_answered_not_awaited() -> None:
    """A call of the agent's that would wait, in the answer that calls a client tool, gets
    an error return: the run ends for the client, waiting on nothing."""
    parts = [
        ToolCallPart("wait", {}, tool_call_id="w1"),
        ToolCallPart("get_weather", {"city": "Oslo"}, tool_call_id="c1"),
    ]
    result, _ = _run(parts)
    assert isinstance(result.output, DeferredToolRequests)
    calls, others = client_calls(result.output)
    assert [c.id for c in calls] == ["c1"]
    assert [(o.tool_call_id, o.content) for o in others] == [("w1", NOT_AWAITED)]


def test_tool_choice_none_offers_no_client_tool_and_required_is_a_setting() -> None:
    """ "none" leaves the client's tools out; "required" and a named tool are the model's
    `tool_choice` setting."""
    _, offered = _run([TextPart("hi")], choice="none")
    assert offered == [["own", "wait"]]
    assert tool_settings("required") == {"tool_choice": "required"}
    assert tool_settings({"name": "get_weather"}) == {"tool_choice": ["get_weather"]}
    assert tool_settings("auto") is None


@pytest.mark.parametrize(
    ("tools", "choice", "said"),
    [
        ([{"name": "own"}], None, "agent's own tools"),
        ([{"name": "a b"}], None, "invalid tool name"),
        ([{"name": "x"}, {"name": "x"}], None, "given twice"),
        ([{"name": "x", "parameters": {"type": "array"}}], None, "type 'object'"),
        ([{"name": "x"}], {"name": "y"}, "not among the tools"),
        ([], "required", "at least one tool"),
        ([{"name": f"t{i}"} for i in range(129)], None, "at most 128"),
        ([{"name": "x", "description": "d" * 300_000}], None, "bytes as JSON"),
    ],
)
def test_bad_client_tools_are_refused(tools: Any, choice: Any, said: str) -> None:
    """What a run cannot take is refused as invalid input, naming what is wrong."""
    with pytest.raises(InvalidInput, match=said):
        check_client_tools(tools, choice, {"own", "wait"}, field="tools")


def test_results_already_in_the_history_are_not_given_again() -> None:
    """A continuation tried again after its results joined the transcript does not add
    them a second time."""
    results = [{"toolCallId": "c1", "toolName": "t", "content": "x"}]
    fresh = tool_returns(results, [ModelRequest(parts=[UserPromptPart("go")])])
    assert [(p.tool_call_id, p.content) for p in fresh] == [("c1", "x")]
    assert tool_returns(results, [ModelRequest(parts=fresh)]) == []


def test_a_call_left_without_result_is_answered_before_the_next_user_message() -> None:
    """A client call never answered (a new user message came) is shown to the model with a
    no-result return just before that message; answered calls and the copy's source are
    left as they are."""
    call = ModelResponse(parts=[ToolCallPart("get_weather", {}, tool_call_id="c1")])
    later = ModelRequest(parts=[UserPromptPart("never mind")])
    history: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("go")]), call, later]
    sent = answer_left_calls(history)
    first, *rest = sent[2].parts
    assert isinstance(first, ToolReturnPart)
    assert (first.tool_call_id, first.content) == ("c1", NO_RESULT)
    assert rest == list(later.parts) and history[2] is later
    answered = [
        *history[:2],
        ModelRequest(
            parts=tool_returns(
                [{"toolCallId": "c1", "toolName": "get_weather", "content": "x"}], history[:2]
            )
        ),
        later,
    ]
    assert answer_left_calls(answered) == answered
