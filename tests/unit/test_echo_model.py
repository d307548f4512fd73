"""Unit tests for the offline `builtin/echo` model and for model reference resolution."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelAPIError
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel

from switchboard.shared.errors import InvalidInput
from switchboard.shared.runtime import echo
from switchboard.shared.runtime.echo import (
    DirectiveError,
    EchoModel,
    ToolCallDirective,
    echo_model,
    parse_directives,
)
from switchboard.shared.runtime.models import (
    HTTP_TIMEOUT_S,
    clear_model_cache,
    resolve_model,
    validate_model_ref,
)

pytestmark = pytest.mark.unit

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def echo_agent(calls: list[dict[str, Any]] | None = None) -> Agent[None, str]:
    """An echo agent with an `add` tool that records its calls."""
    agent = Agent(echo_model())

    @agent.tool_plain
    def add(a: int, b: int) -> dict[str, int]:
        if calls is not None:
            calls.append({"a": a, "b": b})
        return {"sum": a + b}

    return agent


def tool_calls(messages: list[Any]) -> list[ToolCallPart]:
    return [
        part
        for m in messages
        if isinstance(m, ModelResponse)
        for part in m.parts
        if isinstance(part, ToolCallPart)
    ]


# ---- directives ----------------------------------------------------------------------


def test_plain_message_is_echoed() -> None:
    """A message without directives is answered with itself."""
    assert run(echo_agent().run("hello there")).output == "hello there"


def test_inter_session_first_line_is_ignored() -> None:
    """The replayed `[Inter-session message] ...` line is not part of the echo."""
    prompt = "[Inter-session message] sourceSession=agent:a:main\nping"
    assert run(echo_agent().run(prompt)).output == "ping"


def test_reply_directive_answers_exactly() -> None:
    """`/reply` answers its text exactly, ignoring the rest of the message."""
    result = run(echo_agent().run("please stop\n/reply REPLY_SKIP"))
    assert result.output == "REPLY_SKIP"


def test_tool_lines_call_tools_and_reply_with_results() -> None:
    """Each `/tool` line is one call with its JSON arguments; then the results are replied."""
    calls: list[dict[str, Any]] = []
    prompt = '/tool add {"a": 1, "b": 2}\n/tool add {"a": 3, "b": 4}'
    result = run(echo_agent(calls).run(prompt))
    # pydantic-ai runs the calls of one response concurrently, so they may execute in any
    # order; the response itself lists them in the order of the lines.
    assert sorted(calls, key=lambda c: c["a"]) == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    parts = tool_calls(result.all_messages())
    assert [c.tool_call_id for c in parts] == ["echo_1", "echo_2"]
    assert [c.args_as_dict() for c in parts] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    assert result.output == '{"sum":3}\n{"sum":7}'


def test_reply_wins_after_tool_results() -> None:
    """With `/tool` and `/reply`, the tool still runs and the final answer is the reply text."""
    calls: list[dict[str, Any]] = []
    result = run(echo_agent(calls).run('/tool add {"a": 1, "b": 1}\n/reply ANNOUNCE_SKIP'))
    assert calls == [{"a": 1, "b": 1}]
    assert result.output == "ANNOUNCE_SKIP"


def test_tool_call_ids_continue_over_the_conversation() -> None:
    """Ids count the calls already in the history, so a later turn never reuses one."""
    agent = echo_agent()
    first = run(agent.run('/tool add {"a": 1, "b": 1}'))
    second = run(agent.run('/tool add {"a": 2, "b": 2}', message_history=first.all_messages()))
    assert [c.tool_call_id for c in tool_calls(second.new_messages())] == ["echo_2"]


def test_unknown_tool_ends_with_the_error_instead_of_looping() -> None:
    """A `/tool` for a missing tool gets pydantic-ai's retry text back as the reply."""
    result = run(echo_agent().run("/tool nope {}"))
    assert "Unknown tool name: 'nope'" in result.output


def test_sleep_delays_the_first_call_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`/sleep` delays the answer to the message, not the follow-up after tool results."""
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(delay: float, result: Any = None) -> Any:
        slept.append(delay)
        return await real_sleep(0, result)

    monkeypatch.setattr("switchboard.shared.runtime.echo.asyncio.sleep", recording_sleep)
    result = run(echo_agent().run('/sleep 0.2\n/tool add {"a": 1, "b": 1}'))
    assert result.output == '{"sum":2}'
    assert slept == [0.2]


def test_fail_raises_a_model_error() -> None:
    """`/fail` makes the model call raise with the given message."""
    with pytest.raises(ModelAPIError, match="boom here"):
        run(echo_agent().run("/fail boom here"))


@pytest.mark.parametrize(
    "line", ["/tool add {not json", "/tool add [1, 2]", "/tool", "/sleep soon", "/sleep -1"]
)
def test_malformed_directive_fails_the_call_and_names_the_line(line: str) -> None:
    """A malformed directive is a model error quoting the offending line."""
    with pytest.raises(ModelAPIError) as info:
        run(echo_agent().run(line))
    assert repr(line) in str(info.value)


def test_tool_without_arguments_gets_an_empty_object() -> None:
    """`/tool name` alone calls the tool with no arguments."""
    assert parse_directives("/tool sessions_list").tool_calls == (
        ToolCallDirective("sessions_list", {}),
    )


def test_only_directives_answers_ok() -> None:
    """A message made only of `/sleep` has nothing left to echo and answers `ok`."""
    assert run(echo_agent().run("/sleep 0")).output == "ok"


@given(st.text().filter(lambda t: not any(ln.lstrip().startswith("/") for ln in t.splitlines())))
def test_text_without_directives_parses_to_itself(text: str) -> None:
    """Text with no directive line yields no directives and keeps its content."""
    directives = parse_directives(text)
    assert directives.tool_calls == () and directives.reply is None and directives.fail is None
    assert directives.text == "\n".join(text.splitlines()).strip()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text(), json_values, max_size=4))
def test_tool_arguments_round_trip(args: dict[str, Any]) -> None:
    """Any JSON object on a `/tool` line comes back as the call's arguments."""
    (call,) = parse_directives(f"/tool t {json.dumps(args)}").tool_calls
    assert call == ToolCallDirective("t", args)


def test_parse_errors_are_directive_errors() -> None:
    """Parsing raises `DirectiveError`, a `ValueError`, for the model to translate."""
    with pytest.raises(DirectiveError):
        parse_directives("/sleep nan")


# ---- usage -----------------------------------------------------------------------------


def test_usage_counts_words() -> None:
    """Input is the words of the messages, output the words of the reply."""
    result = run(Agent(echo_model(), instructions="ignored in counts").run("one two three"))
    assert (result.usage.input_tokens, result.usage.output_tokens) == (3, 3)


def test_usage_over_a_tool_round_counts_every_message() -> None:
    """The follow-up request counts the prompt, the call and the result as input."""
    result = run(echo_agent().run('/tool add {"a": 1, "b": 2}'))
    # call 1: the prompt's 6 words in, `add {"a":1,"b":2}` 2 words out;
    # call 2: prompt 6 + call 2 + result `{"sum":3}` 1 = 9 in, 1 out.
    assert (result.usage.input_tokens, result.usage.output_tokens) == (15, 3)


def test_streamed_requests_report_the_same_usage() -> None:
    """A streamed run gives the same text and usage as a plain one."""
    agent = echo_agent()

    async def streamed() -> tuple[str, Any]:
        async with agent.run_stream("a b c d") as stream:
            return await stream.get_output(), stream.usage

    output, usage = run(streamed())
    assert output == "a b c d"
    assert (usage.input_tokens, usage.output_tokens) == (4, 4)


def test_a_message_is_counted_once_while_it_lives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs that share history objects count each message once, with the same counts."""
    model = echo_model()
    history: list[Any] = [
        ModelRequest(parts=[UserPromptPart("one two")]),
        ModelResponse(parts=[TextPart("three"), ToolCallPart("add", {"a": 1})]),
        ModelRequest(parts=[UserPromptPart("four five six")]),
    ]
    counted: list[Any] = []
    real = echo._message_texts
    monkeypatch.setattr(echo, "_message_texts", lambda ms: counted.extend(ms) or real(ms))

    def ask(messages: list[Any]) -> ModelResponse:
        return run(model.request(messages, None, ModelRequestParameters()))

    first = ask(history)
    assert first.usage.input_tokens == 2 + 3 + 3  # `add {"a":1}` is two words
    assert first.text == "four five six"
    latest = ModelRequest(parts=[UserPromptPart("/tool add {}")])
    again = ask([*history, first, latest])
    assert counted == [*history, first, latest]  # the history counted once, in the first
    assert again.usage.input_tokens == 8 + 3 + 3
    assert again.parts == [ToolCallPart("add", {}, tool_call_id="echo_2")]  # one call before
    fresh = ask([ModelRequest(parts=[UserPromptPart("x y")])])
    assert fresh.usage.input_tokens == 2  # a new message object is counted on its own


def test_a_message_gone_is_forgotten() -> None:
    counts = echo._MessageCounts()
    message = ModelRequest(parts=[UserPromptPart("one two")])
    assert counts.total([message, message]) == (4, 0)
    assert len(counts._counted) == 1
    del message
    assert counts._counted == {}


# ---- resolve_model ---------------------------------------------------------------------


@dataclass(frozen=True)
class Provider:
    """Stands in for `shared.config.ProviderConfig`."""

    base_url: str | None = None
    api_key: str | None = None
    api: str | None = None


@pytest.fixture(autouse=True)
def empty_model_cache() -> None:
    """Each test builds its own models."""
    clear_model_cache()


def test_builtin_echo_resolves_to_the_echo_model() -> None:
    """`builtin/echo` needs no provider config."""
    assert isinstance(resolve_model("builtin/echo", {}, env={}), EchoModel)


@pytest.mark.parametrize(
    "ref", ["echo", "/echo", "builtin/", "builtin/gpt", "nowhere/model", "local/m", ""]
)
def test_bad_refs_are_invalid_input_naming_the_ref(ref: str) -> None:
    """Unknown providers, empty parts and refs without `/` are rejected with the ref."""
    providers = {"local": Provider(base_url=None)}
    with pytest.raises(InvalidInput) as resolved:
        resolve_model(ref, providers, env={})
    with pytest.raises(InvalidInput) as validated:
        validate_model_ref(ref, providers)
    for error in (resolved.value, validated.value):
        assert error.fields["field"] == "model"
        assert f"invalid model: {ref} (" in error.message


def test_configured_provider_uses_chat_completions_at_its_base_url() -> None:
    """An OpenAI-style provider becomes an OpenAIChatModel talking to its baseUrl."""
    providers = {"vllm": Provider(base_url="http://127.0.0.1:9/v1", api="openai-completions")}
    model = resolve_model("vllm/qwen/qwen3", providers, env={})
    assert isinstance(model, OpenAIChatModel)
    assert model.model_name == "qwen/qwen3"
    assert str(model.client.base_url) == "http://127.0.0.1:9/v1/"
    assert model.settings == {"timeout": HTTP_TIMEOUT_S}


def test_openai_key_is_not_sent_to_other_servers() -> None:
    """OPENAI_API_KEY is only used for the `openai` provider, never for a configured server."""
    providers = {"local": Provider(base_url="http://127.0.0.1:9/v1")}
    model = resolve_model("local/m", providers, env={"OPENAI_API_KEY": "sk-secret"})
    assert isinstance(model, OpenAIChatModel)
    assert model.client.api_key == "none"


def test_unconfigured_openai_reads_the_environment() -> None:
    """`openai/...` without config takes its key and base URL from the environment."""
    env = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    model = resolve_model("openai/gpt-4o-mini", {}, env=env)
    assert isinstance(model, OpenAIChatModel)
    assert model.client.api_key == "sk-test"
    assert str(model.client.base_url) == "http://127.0.0.1:9/v1/"


def test_openai_without_key_or_url_is_invalid() -> None:
    """Reaching api.openai.com without a key is refused up front."""
    with pytest.raises(InvalidInput, match="OPENAI_API_KEY"):
        resolve_model("openai/gpt-4o-mini", {}, env={})


def test_responses_api_builds_a_responses_model() -> None:
    """`api: openai-responses` selects the Responses API."""
    providers = {"gw": Provider(base_url="http://127.0.0.1:9/v1", api="openai-responses")}
    assert isinstance(resolve_model("gw/m", providers, env={}), OpenAIResponsesModel)


def test_anthropic_from_env_and_from_config() -> None:
    """`anthropic/...` reads ANTHROPIC_API_KEY; `anthropic-messages` works for any name."""
    env = {"ANTHROPIC_API_KEY": "sk-ant"}
    assert isinstance(resolve_model("anthropic/claude-x", {}, env=env), AnthropicModel)
    providers = {
        "proxy": Provider(base_url="http://127.0.0.1:9", api_key="k", api="anthropic-messages")
    }
    assert isinstance(resolve_model("proxy/claude-x", providers, env={}), AnthropicModel)


def test_anthropic_without_key_is_invalid() -> None:
    """A missing Anthropic key is an InvalidInput naming the model."""
    with pytest.raises(InvalidInput, match="anthropic/claude-x"):
        resolve_model("anthropic/claude-x", {}, env={})


def test_unsupported_api_is_invalid() -> None:
    """An api this product does not speak is rejected by name."""
    providers = {"g": Provider(base_url="http://x", api="google-generative-ai")}
    with pytest.raises(InvalidInput, match="google-generative-ai"):
        validate_model_ref("g/gemini", providers)


def test_models_are_cached_per_event_loop() -> None:
    """The same ref gives the same model on one loop and a fresh one on another loop."""
    providers = {"local": Provider(base_url="http://127.0.0.1:9/v1")}

    async def twice() -> tuple[Any, Any]:
        return resolve_model("local/m", providers, env={}), resolve_model(
            "local/m", providers, env={}
        )

    first, again = run(twice())
    assert first is again
    (other, _) = run(twice())
    assert other is not first


def test_cache_key_includes_the_provider_config() -> None:
    """A changed baseUrl builds a new model; clear_model_cache forgets the old ones."""
    a = resolve_model("local/m", {"local": Provider(base_url="http://a/v1")}, env={})
    b = resolve_model("local/m", {"local": Provider(base_url="http://b/v1")}, env={})
    assert a is not b
    assert resolve_model("local/m", {"local": Provider(base_url="http://a/v1")}, env={}) is a
    clear_model_cache()
    assert resolve_model("local/m", {"local": Provider(base_url="http://a/v1")}, env={}) is not a
