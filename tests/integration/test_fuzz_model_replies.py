"""Model replies that are not valid tool calls never crash a worker or strand a lane.

The fake model answers with unknown tools, arguments that are not JSON, arguments of the
wrong types or shapes; the run either gives the model a tool error to retry with and
finishes, or ends with a clear error. Either way the session's next run completes, on the
same worker.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchboard_testkit.fake_model import FakeModelServer

pytestmark = pytest.mark.integration

TOOLS = ["sessions_list", "sessions_history", "sessions_send", "sessions_spawn", "agents_list"]


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    """One fake OpenAI-compatible model for the module."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def config_data(fake_model: FakeModelServer) -> dict[str, Any]:
    """Every agent runs on the fake model."""
    fake_model.reset()
    return {
        "models": {"providers": {"fake": {"baseUrl": fake_model.base_url, "api": "openai"}}},
        "agents": {"defaults": {"model": "fake/fake-model"}},
        "runs": {"timeoutSeconds": 30},
    }


def run_to_end(rpc: Callable[..., Any], session: str, message: str) -> dict[str, Any]:
    """Start a run and wait for its outcome."""
    started = rpc("agent", sessionKey=session, message=message)
    outcome: dict[str, Any] = rpc("agent.wait", runId=started["runId"], timeoutMs=30_000)
    return outcome


def tool_messages(requests: list[dict[str, Any]]) -> list[str]:
    """The texts of every `tool` message the model was sent."""
    return [
        json.dumps(m.get("content"))
        for body in requests
        for m in body.get("messages", [])
        if m.get("role") == "tool"
    ]


def test_unknown_tool_gets_a_tool_error_and_the_run_goes_on(
    fake_model: FakeModelServer, rpc: Callable[..., Any], worker: Any
) -> None:
    """An unknown tool name: the model is told so and can answer."""
    fake_model.script(
        {"tool_calls": [{"name": "no_such_tool", "arguments": "{}"}]}, {"content": "done"}
    )
    outcome = run_to_end(rpc, "main", "go")
    assert (outcome["status"], outcome.get("reply")) == ("ok", "done"), outcome
    assert any("no_such_tool" in text for text in tool_messages(fake_model.requests()))


def test_arguments_that_are_not_json_get_a_retry(
    fake_model: FakeModelServer, rpc: Callable[..., Any], worker: Any
) -> None:
    """Arguments that do not parse: the model is asked again and can answer."""
    fake_model.script(
        {"tool_calls": [{"name": "sessions_list", "arguments": '{"limit": 5,'}]},
        {"content": "done"},
    )
    outcome = run_to_end(rpc, "main", "go")
    assert (outcome["status"], outcome.get("reply")) == ("ok", "done"), outcome
    assert len(tool_messages(fake_model.requests())) == 1


def test_arguments_of_the_wrong_type_are_a_tool_error_naming_the_field(
    fake_model: FakeModelServer, rpc: Callable[..., Any], worker: Any
) -> None:
    """`sessionKey: 5`: the tool result says `sessionKey must be a string`."""
    fake_model.script(
        {"tool_calls": [{"name": "sessions_history", "arguments": {"sessionKey": 5}}]},
        {"content": "done"},
    )
    outcome = run_to_end(rpc, "main", "go")
    assert (outcome["status"], outcome.get("reply")) == ("ok", "done"), outcome
    assert any("sessionKey must be a string" in t for t in tool_messages(fake_model.requests()))


def test_a_model_that_never_calls_tools_right_ends_with_a_clear_error(
    fake_model: FakeModelServer, rpc: Callable[..., Any], worker: Any
) -> None:
    """Endless invalid calls end the run as an error; the session's next run completes."""
    bad = {"tool_calls": [{"name": "sessions_list", "arguments": "not json"}]}
    fake_model.script(*[bad] * 10)
    outcome = run_to_end(rpc, "main", "go")
    assert outcome["status"] == "error", outcome
    assert "sessions_list" in outcome["error"] and "Traceback" not in outcome["error"]
    fake_model.reset()
    assert run_to_end(rpc, "main", "again")["status"] == "ok"


arguments = st.one_of(
    st.text(max_size=30),  # mostly not JSON
    st.sampled_from(["{", "[1, 2]", "null", "5", '"text"', '{"a": }', "{}}"]),
    st.dictionaries(
        st.sampled_from(["sessionKey", "message", "limit", "kinds", "task", "tasks", "label"]),
        st.one_of(st.integers(), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)),
        max_size=3,
    ).map(json.dumps),
)
tool_call = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(TOOLS), st.text(max_size=20)), "arguments": arguments}
)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(calls=st.lists(tool_call, min_size=1, max_size=3), repeats=st.integers(1, 4))
def test_malformed_tool_calls_never_strand_the_session(
    calls: list[dict[str, Any]],
    repeats: int,
    fake_model: FakeModelServer,
    rpc: Callable[..., Any],
    worker: Any,
) -> None:
    """Any garbage in tool calls, repeated: the run ends (ok or a clear error), the lane frees."""
    fake_model.reset()
    fake_model.script(*[{"tool_calls": calls}] * repeats, {"content": "done"})
    outcome = run_to_end(rpc, "agent:main:fuzz", "go")
    assert outcome["status"] in ("ok", "error"), outcome
    if outcome["status"] == "error":
        assert outcome["error"] and "Traceback" not in outcome["error"], outcome
    fake_model.reset()
    after = run_to_end(rpc, "agent:main:fuzz", "ping")
    assert (after["status"], after.get("reply")) == ("ok", "ping"), after
