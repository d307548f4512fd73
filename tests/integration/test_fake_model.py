"""Integration tests: pydantic-ai's real OpenAI client against the project's fake model server."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import httpx
import pytest
from pydantic_ai import Agent
from pydantic_ai.exceptions import CallDeferred, ModelHTTPError
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults

from switchboard.shared.config import ProviderConfig
from switchboard.shared.runtime.models import clear_model_cache, resolve_model
from switchboard.shared.runtime.transcript import to_model_messages, to_transcript
from switchboard_testkit.fake_model import REQUEST_LOG_SIZE, FakeModelServer

pytestmark = pytest.mark.integration

T = TypeVar("T")
MODEL_REF = "fake/fake-model"


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeModelServer]:
    """One fake model server for the module."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def fake_model(fake_server: FakeModelServer) -> Iterator[FakeModelServer]:
    """The module's server with an empty script, no recorded requests and no latency."""
    fake_server.reset()
    clear_model_cache()
    yield fake_server


@pytest.fixture
def providers(fake_model: FakeModelServer) -> dict[str, ProviderConfig]:
    """`models.providers` with one OpenAI-compatible provider pointing at the fake server."""
    return {"fake": ProviderConfig(base_url=fake_model.base_url, api="openai-completions")}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def make_agent(
    providers: dict[str, ProviderConfig], calls: list[dict[str, Any]] | None = None, **kw: Any
) -> Agent[None, Any]:
    """An agent on the fake model (built inside the running loop) with `add` and `wait` tools."""
    agent: Agent[None, Any] = Agent(
        resolve_model(MODEL_REF, providers), output_type=[str, DeferredToolRequests], **kw
    )

    @agent.tool_plain
    def add(a: int, b: int) -> dict[str, int]:
        if calls is not None:
            calls.append({"a": a, "b": b})
        return {"sum": a + b}

    @agent.tool_plain
    def wait(target: str) -> str:
        raise CallDeferred(metadata={"target": target})

    return agent


async def run_agent(agent: Agent[None, Any], prompt: str | None, **kw: Any) -> Any:
    """Run inside `async with agent:` so the HTTP client closes before the loop ends."""
    async with agent:
        return await agent.run(prompt, **kw)


async def ask(providers: dict[str, ProviderConfig], prompt: str, **kw: Any) -> Any:
    return await run_agent(make_agent(providers), prompt, **kw)


def test_resolve_model_builds_a_real_openai_chat_model(providers: dict[str, Any]) -> None:
    """The path under test is pydantic-ai's own OpenAI Chat Completions client."""
    assert isinstance(resolve_model(MODEL_REF, providers), OpenAIChatModel)


def test_plain_reply_echoes_the_user_message(
    fake_model: FakeModelServer, providers: dict[str, Any]
) -> None:
    """Without a script the server echoes, and it records what the client sent."""
    assert run(ask(providers, "hello there")).output == "hello there"
    (body,) = fake_model.requests()
    assert body["model"] == "fake-model"
    assert body["messages"][-1] == {"role": "user", "content": "hello there"}


def test_scripted_tool_call_runs_the_tool_then_replies(
    fake_model: FakeModelServer, providers: dict[str, Any]
) -> None:
    """A scripted tool call runs the real tool; its result reaches the next request."""
    fake_model.script(
        {"tool_calls": [{"id": "call_x", "name": "add", "arguments": {"a": 2, "b": 3}}]},
        {"content": "the sum is 5"},
    )
    calls: list[dict[str, Any]] = []
    result = run(run_agent(make_agent(providers, calls), "add please"))
    assert calls == [{"a": 2, "b": 3}]
    assert result.output == "the sum is 5"
    follow_up = fake_model.requests()[1]["messages"]
    assert follow_up[-2]["tool_calls"][0]["id"] == "call_x"
    assert follow_up[-1] == {"role": "tool", "tool_call_id": "call_x", "content": '{"sum":5}'}


def test_directive_tool_call_replies_with_the_result(providers: dict[str, Any]) -> None:
    """The echo directives work over the wire: `/tool` then the result as the reply."""
    calls: list[dict[str, Any]] = []
    result = run(run_agent(make_agent(providers, calls), '/tool add {"a": 4, "b": 5}'))
    assert calls == [{"a": 4, "b": 5}]
    assert result.output == '{"sum":9}'


def test_default_and_scripted_latency(
    fake_model: FakeModelServer, providers: dict[str, Any]
) -> None:
    """`/_config` latency delays every answer; a scripted reply's latency replaces it."""
    fake_model.configure(latency_ms=1500)
    started = time.monotonic()
    run(ask(providers, "slow"))
    assert time.monotonic() - started >= 1.5
    fake_model.script({"content": "quick", "latency_ms": 0})
    started = time.monotonic()
    assert run(ask(providers, "fast?")).output == "quick"
    assert time.monotonic() - started < 1.5  # the scripted 0 ms, not the default 1,500 ms


def test_usage_is_counted_in_words(providers: dict[str, Any]) -> None:
    """Usage counts words: every message sent (instructions too) in, the reply out."""
    result = run(run_agent(make_agent(providers, instructions="be brief"), "one two three"))
    assert (result.usage.input_tokens, result.usage.output_tokens) == (5, 3)


def test_streaming_gives_the_same_reply_and_usage(
    fake_model: FakeModelServer, providers: dict[str, Any]
) -> None:
    """`stream: true` answers in SSE chunks that add up to the same text and usage."""

    async def streamed() -> tuple[str, Any]:
        agent = Agent(resolve_model(MODEL_REF, providers))
        async with agent, agent.run_stream("one two three four") as stream:
            return await stream.get_output(), stream.usage

    output, usage = run(streamed())
    assert output == "one two three four"
    assert (usage.input_tokens, usage.output_tokens) == (4, 4)
    assert fake_model.requests()[0]["stream"] is True


def test_scripted_error_status_fails_the_run(
    fake_model: FakeModelServer, providers: dict[str, Any]
) -> None:
    """A scripted non-200 reply reaches the caller as a model HTTP error."""
    fake_model.script({"content": "bad request here", "status": 400})
    with pytest.raises(ModelHTTPError) as info:
        run(ask(providers, "x"))
    assert info.value.status_code == 400
    assert "bad request here" in str(info.value)


def test_fail_directive_fails_the_run(providers: dict[str, Any]) -> None:
    """`/fail` answers an error that ends the run."""
    with pytest.raises(ModelHTTPError, match="kaput"):
        run(ask(providers, "/fail kaput"))


def test_deferred_call_resumes_from_the_stored_transcript(
    fake_model: FakeModelServer, providers: dict[str, Any]
) -> None:
    """A run parked on CallDeferred resumes from its JSON transcript with DeferredToolResults."""
    parked = run(ask(providers, '/tool wait {"target": "run-1"}'))
    assert isinstance(parked.output, DeferredToolRequests)
    (call,) = parked.output.calls
    assert parked.output.metadata[call.tool_call_id] == {"target": "run-1"}

    stored = json.loads(json.dumps(to_transcript(parked.all_messages(), model="m", provider="p")))
    history = to_model_messages(stored)
    results = DeferredToolResults(calls={call.tool_call_id: {"status": "ok", "reply": "pong"}})
    resumed = run(ask_resumed(providers, history, results))

    assert resumed.output == '{"status":"ok","reply":"pong"}'
    last_sent = fake_model.requests()[-1]["messages"]
    assert last_sent[-2]["tool_calls"][0]["id"] == call.tool_call_id
    assert last_sent[-1]["tool_call_id"] == call.tool_call_id


async def ask_resumed(
    providers: dict[str, Any], history: list[Any], results: DeferredToolResults
) -> Any:
    agent = make_agent(providers)
    return await run_agent(agent, None, message_history=history, deferred_tool_results=results)


def test_models_endpoint_lists_the_fake_model(fake_model: FakeModelServer) -> None:
    """`GET /v1/models` answers like OpenAI's."""
    body = httpx.get(f"{fake_model.base_url}/models").json()
    assert body["object"] == "list" and body["data"][0]["id"] == "fake-model"


def test_request_log_keeps_the_last_thousand(fake_model: FakeModelServer) -> None:
    """`/_requests` is capped, dropping the oldest bodies."""
    with httpx.Client(base_url=fake_model.base_url) as client:
        for i in range(REQUEST_LOG_SIZE + 5):
            body = {"model": "m", "messages": [{"role": "user", "content": f"m{i}"}]}
            client.post("/chat/completions", json=body).raise_for_status()
    recorded = fake_model.requests()
    assert len(recorded) == REQUEST_LOG_SIZE
    assert recorded[0]["messages"][0]["content"] == "m5"


def test_script_rejects_unknown_fields(fake_model: FakeModelServer) -> None:
    """A typo in a scripted reply is refused instead of silently ignored."""
    response = httpx.post(f"{fake_model.url}/_script", json={"replies": [{"contnet": "x"}]})
    assert response.status_code == 400


def test_cli_serves_on_the_given_port() -> None:
    """`python -m switchboard_testkit.fake_model --port N` serves the API."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "switchboard_testkit.fake_model", "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        assert response.json()["data"][0]["id"] == "fake-model"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
