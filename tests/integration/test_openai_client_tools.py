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
def config_data() -> dict[str, Any]:
    """One agent on the echo model, a short run deadline."""
    return {"agents": {"list": [{"id": "main", "default": True}]}, "runs": {"timeoutSeconds": 8}}


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
