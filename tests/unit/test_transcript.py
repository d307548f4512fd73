"""Unit tests for the pydantic-ai <-> SPEC §9 transcript conversion."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.usage import RequestUsage

from switchboard.shared.runtime.echo import echo_model
from switchboard.shared.runtime.transcript import (
    final_text,
    inter_session_prefix,
    latest_tool_result_text,
    to_model_messages,
    to_transcript,
)

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
T0_MS = 1767323045678


def tool_run() -> Any:
    """An echo run that calls `add` once, with a system prompt that must not be stored."""
    agent = Agent(echo_model(), system_prompt="SECRET SYSTEM PROMPT")

    @agent.tool_plain
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    return asyncio.run(agent.run('/tool add {"a": 1, "b": 2}'))


# ---- to_transcript ------------------------------------------------------------------


def test_a_tool_run_becomes_user_call_result_reply() -> None:
    """A run with one tool call is four messages in OpenClaw's raw shape."""
    transcript = to_transcript(tool_run().all_messages(), model="echo", provider="builtin")
    assert [m["role"] for m in transcript] == ["user", "assistant", "toolResult", "assistant"]
    user, call, result, reply = transcript
    assert user["content"] == '/tool add {"a": 1, "b": 2}'
    assert call["content"] == [
        {"type": "toolCall", "id": "echo_1", "name": "add", "arguments": {"a": 1, "b": 2}}
    ]
    assert call["stopReason"] == "toolUse" and reply["stopReason"] == "stop"
    assert result == {
        "role": "toolResult",
        "toolCallId": "echo_1",
        "toolName": "add",
        "content": [{"type": "text", "text": '{"sum":3}'}],
        "isError": False,
        "timestamp": result["timestamp"],
    }
    assert reply["content"] == [{"type": "text", "text": '{"sum":3}'}]
    assert (reply["model"], reply["provider"]) == ("echo", "builtin")


def test_system_prompts_are_not_stored() -> None:
    """Instructions and system prompts are supplied per run, never written to the transcript."""
    transcript = to_transcript(tool_run().all_messages(), model="echo", provider="builtin")
    assert b"SECRET" not in orjson.dumps(transcript)


def test_assistant_usage_and_timestamps() -> None:
    """Assistant messages carry input/output/totalTokens and millisecond timestamps."""
    response = ModelResponse(
        parts=[ThinkingPart("hmm"), TextPart("hi")],
        usage=RequestUsage(input_tokens=7, output_tokens=2),
        timestamp=T0,
        finish_reason="length",
    )
    (message,) = to_transcript([response], model="m", provider="p")
    assert message == {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "hi"}],
        "timestamp": T0_MS,
        "model": "m",
        "provider": "p",
        "usage": {"input": 7, "output": 2, "totalTokens": 9},
        "stopReason": "length",
    }


@pytest.mark.parametrize(
    ("outcome", "is_error"), [("success", False), ("failed", True), ("retried", True)]
)
def test_tool_errors_are_flagged(outcome: Any, is_error: bool) -> None:
    """Failed and retried tool returns are `isError: true`, with the bare error text."""
    part = ToolReturnPart("t", "it broke", "c1", outcome=outcome, timestamp=T0)
    (message,) = to_transcript([ModelRequest(parts=[part])], model="m", provider="p")
    assert message["isError"] is is_error
    assert message["content"] == [{"type": "text", "text": "it broke"}]


def test_output_is_json_ready() -> None:
    """Every message serializes to JSON as is."""
    transcript = to_transcript(tool_run().all_messages(), model="echo", provider="builtin")
    assert orjson.loads(orjson.dumps(transcript)) == transcript


# ---- to_model_messages --------------------------------------------------------------


def test_inter_session_user_messages_get_the_prefix_line() -> None:
    """Replayed inter-session input starts with OpenClaw's `[Inter-session message]` line."""
    provenance = {
        "kind": "inter_session",
        "sourceSessionKey": "agent:main:main",
        "sourceChannel": "webchat",
        "sourceTool": "sessions_send",
    }
    (request,) = to_model_messages([{"role": "user", "content": "hi", "provenance": provenance}])
    assert isinstance(request, ModelRequest)
    part = request.parts[0]
    assert isinstance(part, UserPromptPart)
    assert part.content == (
        "[Inter-session message] sourceSession=agent:main:main sourceChannel=webchat "
        "sourceTool=sessions_send\nhi"
    )


@pytest.mark.parametrize(
    ("provenance", "line"),
    [
        ({"kind": "inter_session", "sourceTool": "sessions_send"}, "sourceTool=sessions_send"),
        ({"kind": "inter_session"}, ""),
    ],
)
def test_prefix_names_only_the_parts_that_exist(provenance: dict[str, str], line: str) -> None:
    """Missing provenance fields are left out; none at all gives the bare marker."""
    assert inter_session_prefix(provenance) == f"[Inter-session message] {line}".strip()


def test_external_user_messages_are_not_prefixed() -> None:
    """Only `inter_session` provenance adds the prefix."""
    message = {"role": "user", "content": "hi", "provenance": {"kind": "external_user"}}
    (request,) = to_model_messages([message])
    assert isinstance(request, ModelRequest)
    part = request.parts[0]
    assert isinstance(part, UserPromptPart) and part.content == "hi"


def test_consecutive_tool_results_fold_into_one_request() -> None:
    """Tool results after one assistant turn become one ModelRequest, ids kept."""
    call = {
        "role": "assistant",
        "content": [
            {"type": "toolCall", "id": "a", "name": "t", "arguments": {}},
            {"type": "toolCall", "id": "b", "name": "t", "arguments": {"x": 1}},
        ],
        "stopReason": "toolUse",
    }
    results: list[dict[str, Any]] = [
        {"role": "toolResult", "toolCallId": i, "toolName": "t", "content": [], "isError": False}
        for i in ("a", "b")
    ]
    messages = to_model_messages([{"role": "user", "content": "go"}, call, *results])
    assert [type(m) for m in messages] == [ModelRequest, ModelResponse, ModelRequest]
    response, request = messages[1], messages[2]
    assert [p.tool_call_id for p in response.parts if isinstance(p, ToolCallPart)] == ["a", "b"]
    assert [p.tool_call_id for p in request.parts if isinstance(p, ToolReturnPart)] == ["a", "b"]


def test_error_results_replay_as_failed_returns() -> None:
    """`isError: true` comes back as a failed tool return the model sees as an error."""
    message = {
        "role": "toolResult",
        "toolCallId": "a",
        "toolName": "t",
        "content": [{"type": "text", "text": "nope"}],
        "isError": True,
    }
    (request,) = to_model_messages([message])
    part = request.parts[0]
    assert isinstance(part, ToolReturnPart) and part.outcome == "failed"
    assert part.model_response_str() == '{"error":"nope"}'


def test_compaction_markers_are_skipped_and_system_notes_kept() -> None:
    """OpenClaw compaction markers vanish; other system messages become system notes."""
    marker = {
        "role": "system",
        "content": [{"type": "text", "text": "Compaction"}],
        "__openclaw": {"kind": "compaction", "id": "x", "seq": 1},
    }
    note = {"role": "system", "content": [{"type": "text", "text": "sub-agent finished"}]}
    (request,) = to_model_messages([marker, note])
    assert isinstance(request, ModelRequest)
    (part,) = request.parts
    assert isinstance(part, SystemPromptPart) and part.content == "sub-agent finished"


def test_string_assistant_content_is_text() -> None:
    """OpenClaw also allows assistant content as a plain string."""
    (response,) = to_model_messages([{"role": "assistant", "content": "plain"}])
    assert isinstance(response, ModelResponse) and response.text == "plain"


def test_replayed_history_reaches_the_model() -> None:
    """A session's next turn sees its stored history (here: in the echo model's input count)."""
    stored = to_transcript(tool_run().all_messages(), model="echo", provider="builtin")
    history = to_model_messages(orjson.loads(orjson.dumps(stored)))
    result = asyncio.run(Agent(echo_model()).run("again", message_history=history))
    assert result.output == "again"
    # Stored words: prompt 6 + call 2 + result 1 + reply 1, plus the new prompt.
    assert result.usage.input_tokens == 6 + 2 + 1 + 1 + 1


# ---- round trip -----------------------------------------------------------------------

texts = st.text(max_size=20)
stamps = st.integers(min_value=0, max_value=2**42)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
text_blocks = st.builds(lambda t: [{"type": "text", "text": t}], texts)
user_messages = st.fixed_dictionaries(
    {"role": st.just("user"), "content": texts, "timestamp": stamps}
)
tool_results = st.fixed_dictionaries(
    {
        "role": st.just("toolResult"),
        "toolCallId": texts,
        "toolName": texts,
        "content": text_blocks,
        "isError": st.booleans(),
        "timestamp": stamps,
    }
)
system_notes = st.fixed_dictionaries(
    {"role": st.just("system"), "content": text_blocks, "timestamp": stamps}
)
blocks = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    st.builds(lambda t: {"type": "thinking", "thinking": t}, texts),
    st.builds(
        lambda i, n, a: {"type": "toolCall", "id": i, "name": n, "arguments": a},
        texts,
        texts,
        st.dictionaries(texts, json_values, max_size=3),
    ),
)


@st.composite
def assistant_messages(draw: st.DrawFn) -> dict[str, Any]:
    content = draw(st.lists(blocks, max_size=4))
    usage_in, usage_out = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6))
    calls = any(b["type"] == "toolCall" for b in content)
    return {
        "role": "assistant",
        "content": content,
        "timestamp": draw(stamps),
        "model": "m",
        "provider": "p",
        "usage": {"input": usage_in, "output": usage_out, "totalTokens": usage_in + usage_out},
        "stopReason": "toolUse" if calls else draw(st.sampled_from(["stop", "length", "error"])),
    }


transcripts = st.lists(
    st.one_of(user_messages, tool_results, system_notes, assistant_messages()), max_size=8
)


@given(transcripts)
def test_transcript_round_trips_through_model_messages(transcript: list[dict[str, Any]]) -> None:
    """Any transcript this module writes survives to_model_messages -> to_transcript unchanged."""
    again = to_transcript(to_model_messages(transcript), model="m", provider="p")
    assert again == transcript


# ---- final_text / latest_tool_result_text -------------------------------------------


def test_final_text_is_the_last_response_text() -> None:
    """The run's reply is the last response's text, not an earlier one's."""
    messages: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("q")]),
        ModelResponse(parts=[TextPart("first"), ToolCallPart("t", {}, "c")]),
        ModelRequest(parts=[ToolReturnPart("t", "r", "c")]),
        ModelResponse(parts=[TextPart("final")]),
    ]
    assert final_text(messages) == "final"
    assert final_text(messages[:2]) == "first"
    assert final_text(messages[:1]) == ""


def test_latest_tool_result_text() -> None:
    """The newest toolResult's text, or None without one."""
    transcript = to_transcript(tool_run().all_messages(), model="echo", provider="builtin")
    assert latest_tool_result_text(transcript) == '{"sum":3}'
    assert latest_tool_result_text(transcript[:1]) is None
