"""Client-side tools on the OpenAI-compatible api, driven by the real `openai` client
against the api and a worker: a call comes back to the client, its result continues the
same session."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from switchboard.shared.config import Settings
from switchboard_testkit.fake_model import FakeModelServer

pytestmark = pytest.mark.integration

WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = '/tool get_weather {"city": "Paris"}'
SESSION = {"x-switchboard-session-key": "agent:main:client-tools"}


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    """The fake OpenAI-compatible model server."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def config_data(fake: FakeModelServer) -> dict[str, Any]:
    """`main` on the echo model, `remote` on the fake model server; a short run deadline."""
    return {
        "models": {"providers": {"fake": {"baseUrl": fake.base_url, "api": "openai"}}},
        "agents": {
            "list": [
                {"id": "main", "default": True},
                {"id": "remote", "model": "fake/fake-model"},
            ]
        },
        "runs": {"timeoutSeconds": 8},
    }


@pytest.fixture
def oa(api_url: str, settings: Settings) -> Iterator[openai.OpenAI]:
    """The real OpenAI client pointed at the api (no retries: every answer is seen)."""
    with openai.OpenAI(
        base_url=f"{api_url}/v1", api_key=settings.token, max_retries=0, timeout=30
    ) as client:
        yield client


def transcript_roles(rpc: Callable[..., Any], key: str) -> list[str]:
    """A session's transcript as its messages' roles."""
    return [m["role"] for m in rpc("chat.history", sessionKey=key)["messages"]]


def test_chat_tool_call_comes_back_and_its_result_continues_the_session(
    worker: Any, oa: openai.OpenAI, rpc: Callable[..., Any]
) -> None:
    """A client tool call ends the run as `tool_calls`; the `tool` message's result is
    read by the model in the same session, which answers with it."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": ASK}]
    first = oa.chat.completions.create(
        model="switchboard/main", messages=messages, tools=[WEATHER], extra_headers=SESSION
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [(c.type, c.function.name) for c in calls] == [("function", "get_weather")]  # type: ignore[union-attr]
    call = calls[0]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    messages += [
        choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = oa.chat.completions.create(
        model="switchboard/main", messages=messages, tools=[WEATHER], extra_headers=SESSION
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "sunny, 21 C"
    key = SESSION["x-switchboard-session-key"]
    assert transcript_roles(rpc, key) == ["user", "assistant", "toolResult", "assistant"]


def test_streamed_tool_call_deltas_are_assembled_by_the_sdk(
    worker: Any, oa: openai.OpenAI, rpc: Callable[..., Any]
) -> None:
    """Streaming sends the call as `delta.tool_calls` chunks and `finish_reason`
    tool_calls; the SDK assembles them, and the streamed continuation answers."""
    headers = {"x-switchboard-session-key": "agent:main:client-tools-stream"}
    arguments = json.dumps({"city": "Paris", "note": "x" * 600})  # several argument chunks
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": f"/tool get_weather {arguments}"}
    ]
    with oa.chat.completions.stream(
        model="switchboard/main", messages=messages, tools=[WEATHER], extra_headers=headers
    ) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        final = stream.get_final_completion()
    deltas = [
        c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls
    ]
    assert len(deltas) >= 3  # the name first, then the arguments in pieces
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = (choice.message.tool_calls or [])[0]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == json.loads(arguments)  # type: ignore[union-attr]
    messages += [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": [{"type": "text", "text": "rainy"}]},
    ]
    with oa.chat.completions.stream(
        model="switchboard/main", messages=messages, tools=[WEATHER], extra_headers=headers
    ) as stream:
        done = stream.get_final_completion()
    assert done.choices[0].finish_reason == "stop"
    assert done.choices[0].message.content == "rainy"


def test_the_model_is_offered_client_tools_beside_the_agents_and_reads_the_result(
    worker: Any, oa: openai.OpenAI, fake: FakeModelServer
) -> None:
    """Over a real OpenAI-compatible provider: the model request offers the client's tool
    with its schema beside the agent's tools and the tool choice; the continuation sends
    the call and its result back to the model."""
    headers = {"x-switchboard-session-key": "agent:remote:client-tools"}
    first = oa.chat.completions.create(
        model="switchboard/remote",
        messages=[{"role": "user", "content": ASK}],
        tools=[WEATHER],
        tool_choice="required",
        extra_headers=headers,
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    asked = fake.requests()[0]
    offered = {t["function"]["name"]: t["function"] for t in asked["tools"]}
    assert offered["get_weather"]["parameters"] == WEATHER["function"]["parameters"]
    assert "sessions_list" in offered  # the agent's own tools are still there
    assert asked["tool_choice"] == "required"
    second = oa.chat.completions.create(
        model="switchboard/remote",
        messages=[{"role": "tool", "tool_call_id": call.id, "content": "cloudy"}],
        tools=[WEATHER],
        extra_headers=headers,
    )
    assert second.choices[0].message.content == "cloudy"
    sent = fake.requests()[-1]["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == call.id
    assert sent[-1] == {"role": "tool", "tool_call_id": call.id, "content": "cloudy"}


def test_responses_function_call_items_and_function_call_output_continue(
    worker: Any, oa: openai.OpenAI
) -> None:
    """Responses: a client call is a `function_call` output item; a
    `function_call_output` with `previous_response_id` continues the same session."""
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": WEATHER["function"]["parameters"],
        "strict": False,
    }
    first = oa.responses.create(model="switchboard/main", input=ASK, tools=[tool])  # type: ignore[list-item]
    assert first.status == "completed"
    [item] = first.output
    assert item.type == "function_call"
    assert (item.name, json.loads(item.arguments)) == ("get_weather", {"city": "Paris"})
    second = oa.responses.create(
        model="switchboard/main",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": item.call_id, "output": "windy"}],
        tools=[tool],  # type: ignore[list-item]
    )
    assert second.output_text == "windy"
    again = oa.responses.retrieve(first.id)
    assert [o.type for o in again.output] == ["function_call"]


def test_streamed_response_sends_function_call_events(worker: Any, oa: openai.OpenAI) -> None:
    """A streamed response with a client call sends the `function_call` item's events,
    its arguments, and a completed response holding the call."""
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": WEATHER["function"]["parameters"],
    }
    with oa.responses.stream(model="switchboard/main", input=ASK, tools=[tool]) as stream:  # type: ignore[list-item]
        types = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in types
    assert "response.output_text.delta" not in types
    assert types[-1] == "response.completed"
    assert [o.type for o in final.output] == ["function_call"]


@pytest.mark.parametrize(
    ("tools", "choice", "said"),
    [
        ([{"type": "function", "function": {"name": "sessions_list"}}], None, "agent's own tools"),
        ([{"type": "function", "function": {"name": "bad name!"}}], None, "invalid tool name"),
        ([{"type": "web_search"}], None, "only 'function' tools"),
        ([WEATHER, WEATHER], None, "given twice"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            None,
            "type 'object'",
        ),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "not among the tools"),
        ([WEATHER] * 129, None, "at most 128"),
    ],
)
def test_bad_tools_are_openai_400s(
    worker: Any, oa: openai.OpenAI, tools: Any, choice: Any, said: str
) -> None:
    """Bad client tools (a name shadowing the agent's tools, a bad name or type, a repeat,
    a non-object schema, a choice of no given tool, too many) are 400s in OpenAI's shape."""
    extra = {"tool_choice": choice} if choice is not None else {}
    with pytest.raises(openai.BadRequestError) as err:
        oa.chat.completions.create(
            model="switchboard/main",
            messages=[{"role": "user", "content": "hi"}],
            tools=tools,
            **extra,
        )
    assert said in err.value.message
    assert err.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_tool_results_must_answer_the_sessions_waiting_calls(
    worker: Any, oa: openai.OpenAI
) -> None:
    """A tool message for no waiting call, one leaving a call unanswered, or a legacy
    function message is a 400; a retried continuation is answered by the same run."""
    headers = {"x-switchboard-session-key": "agent:main:client-tools-check"}
    legacy: ChatCompletionMessageParam = {"role": "function", "name": "f", "content": "x"}
    with pytest.raises(openai.BadRequestError, match="function messages are not supported"):
        oa.chat.completions.create(
            model="switchboard/main", messages=[{"role": "user", "content": "hi"}, legacy]
        )
    tool_msg: ChatCompletionMessageParam = {"role": "tool", "tool_call_id": "nope", "content": "x"}
    with pytest.raises(openai.BadRequestError, match="no tool calls waiting"):
        oa.chat.completions.create(
            model="switchboard/main", messages=[tool_msg], extra_headers=headers
        )
    ask = '/tool get_weather {"city": "A"}\n/tool get_weather {"city": "B"}'
    first = oa.chat.completions.create(
        model="switchboard/main",
        messages=[{"role": "user", "content": ask}],
        tools=[WEATHER],
        extra_headers=headers,
    )
    a, b = first.choices[0].message.tool_calls or []
    with pytest.raises(openai.BadRequestError, match="missing: " + b.id):
        oa.chat.completions.create(
            model="switchboard/main",
            messages=[{"role": "tool", "tool_call_id": a.id, "content": "1"}],
            extra_headers=headers,
        )
    answers: list[ChatCompletionMessageParam] = [
        {"role": "tool", "tool_call_id": a.id, "content": "one"},
        {"role": "tool", "tool_call_id": b.id, "content": "two"},
    ]
    raw = oa.chat.completions.with_raw_response.create(
        model="switchboard/main", messages=answers, extra_headers=headers
    )
    assert raw.parse().choices[0].message.content == "one\ntwo"
    retried = oa.chat.completions.with_raw_response.create(
        model="switchboard/main", messages=answers, extra_headers=headers
    )
    assert retried.headers["x-switchboard-run-id"] == raw.headers["x-switchboard-run-id"]


def test_the_openai_agents_sdk_runs_a_function_tool_through_switchboard(
    worker: Any, api_url: str, settings: Settings
) -> None:
    """An OpenAI Agents SDK agent with a Python function tool, its model a Switchboard
    agent: the call comes back to the SDK, which runs the tool and continues the response
    chain with its output, and the agent answers with it."""
    import asyncio

    import agents

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    async def run() -> Any:
        client = openai.AsyncOpenAI(
            base_url=f"{api_url}/v1", api_key=settings.token, max_retries=0, timeout=60
        )
        model = agents.OpenAIResponsesModel(model="switchboard/main", openai_client=client)
        agent = agents.Agent(name="helper", model=model, tools=[get_weather])
        config = agents.RunConfig(tracing_disabled=True)
        try:
            return await agents.Runner.run(
                agent, ASK, run_config=config, auto_previous_response_id=True
            )
        finally:
            await client.close()

    result = asyncio.run(run())
    assert result.final_output == "sunny in Paris"
    calls = [i for i in result.new_items if i.type == "tool_call_item"]
    assert len(calls) == 1


def test_a_new_message_after_an_unanswered_call_still_reaches_the_model(
    worker: Any, oa: openai.OpenAI, fake: FakeModelServer
) -> None:
    """A client that drops a call and sends a new user message: the provider is sent the
    call answered as without result before that message (a provider refuses calls left
    without results), and the session goes on."""
    headers = {"x-switchboard-session-key": "agent:remote:client-tools-left"}
    first = oa.chat.completions.create(
        model="switchboard/remote",
        messages=[{"role": "user", "content": ASK}],
        tools=[WEATHER],
        extra_headers=headers,
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    later = oa.chat.completions.create(
        model="switchboard/remote",
        messages=[{"role": "user", "content": "never mind"}],
        extra_headers=headers,
    )
    assert later.choices[0].message.content == "never mind"
    sent = fake.requests()[-1]["messages"]
    roles = [(m["role"], m.get("tool_call_id")) for m in sent[-3:]]
    assert roles == [("assistant", None), ("tool", call.id), ("user", None)]
    assert "no result" in sent[-2]["content"]
