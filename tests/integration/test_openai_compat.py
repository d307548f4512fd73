"""The OpenAI-compatible api, driven by the real `openai` client against the api and a worker."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionUserMessageParam

from switchboard.shared.config import Settings
from switchboard.shared.services import Services

pytestmark = pytest.mark.integration


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Two agents, a short run deadline and one send-policy deny rule."""
    return {
        "agents": {"list": [{"id": "main", "default": True}, {"id": "ops"}]},
        "runs": {"timeoutSeconds": 6},
        "session": {
            "sendPolicy": {
                "rules": [{"match": {"keyPrefix": "agent:ops:blocked"}, "action": "deny"}]
            }
        },
    }


@pytest.fixture
def oa(api_url: str, settings: Settings) -> Iterator[openai.OpenAI]:
    """The real OpenAI client pointed at the api (no retries: every answer is seen)."""
    with openai.OpenAI(
        base_url=f"{api_url}/v1", api_key=settings.token, max_retries=0, timeout=30
    ) as client:
        yield client


def user(text: str) -> ChatCompletionUserMessageParam:
    """A user message."""
    return {"role": "user", "content": text}


def history(rpc: Callable[..., Any], key: str) -> list[tuple[str, str]]:
    """A session's transcript as (role, text) pairs."""
    out = []
    for m in rpc("chat.history", sessionKey=key)["messages"]:
        content = m["content"]
        text = content if isinstance(content, str) else "".join(b["text"] for b in content)
        out.append((m["role"], text))
    return out


def test_models_lists_one_model_per_agent(api_url: str, oa: openai.OpenAI) -> None:
    """`GET /v1/models` lists `switchboard/<agentId>`; one model is retrievable by id."""
    models = oa.models.list()
    assert [m.id for m in models.data] == ["switchboard/main", "switchboard/ops"]
    assert {m.owned_by for m in models.data} == {"switchboard"}
    assert oa.models.retrieve("switchboard/ops").id == "switchboard/ops"
    with pytest.raises(openai.NotFoundError):
        oa.models.retrieve("switchboard/nobody")


def test_non_streaming_reply_from_the_sessions_own_transcript(
    worker: Any, oa: openai.OpenAI, rpc: Callable[..., Any], services: Services
) -> None:
    """Only the last user message is sent; the session's own transcript is the context."""
    raw = oa.chat.completions.with_raw_response.create(
        model="switchboard/main",
        messages=[
            {"role": "system", "content": "Be brief."},
            user("an earlier question"),
            {"role": "assistant", "content": "an earlier answer"},
            user("hello there"),
        ],
    )
    reply = raw.parse()
    assert reply.object == "chat.completion"
    assert reply.model == "switchboard/main"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "hello there"
    assert reply.choices[0].finish_reason == "stop"
    # echo counts words of what the model saw: the new message only, not the request's past.
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (2, 2)
    assert reply.usage.total_tokens == 4
    assert raw.headers["x-switchboard-session-key"] == "agent:main:main"
    run_id = raw.headers["x-switchboard-run-id"]
    assert reply.id == f"chatcmpl-{run_id}"
    run = services.store.runs.get(run_id)
    assert run is not None and run.extra_system_prompt == "Be brief."
    assert history(rpc, "main") == [("user", "hello there"), ("assistant", "hello there")]

    again = oa.chat.completions.create(model="switchboard/main", messages=[user("again")])
    assert again.choices[0].message.content == "again"
    assert again.usage is not None and again.usage.prompt_tokens == 2 + 2 + 1
    assert [text for _, text in history(rpc, "main")][2:] == ["again", "again"]


def test_streaming_sends_role_content_finish_usage_then_done(
    worker: Any, oa: openai.OpenAI, client: httpx.Client
) -> None:
    """SSE `chat.completion.chunk` events: role, content, finish, usage, then `[DONE]`."""
    stream = oa.chat.completions.create(
        model="switchboard/ops",
        messages=[user("streamed reply here")],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed reply here"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and finishes[:-1] == [None] * (len(finishes) - 1)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3

    body = {"model": "switchboard/ops", "messages": [user("raw")], "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-switchboard-session-key"] == "agent:ops:main"
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert [e["choices"][0]["delta"].get("content") for e in events] == ["", "raw", None]
    assert "usage" not in events[-1]


def test_session_from_header_else_user_else_main(
    worker: Any, oa: openai.OpenAI, rpc: Callable[..., Any]
) -> None:
    """Session header (either name) wins over `user`; `user` gets a stable session; else main."""

    def send(text: str, *, headers: dict[str, str] | None = None, who: str | None = None) -> str:
        kwargs: dict[str, Any] = {"extra_headers": headers} if headers else {}
        if who is not None:
            kwargs["user"] = who
        raw = oa.chat.completions.with_raw_response.create(
            model="switchboard/ops", messages=[user(text)], **kwargs
        )
        assert raw.parse().choices[0].message.content == text
        return raw.headers["x-switchboard-session-key"]

    assert send("one", headers={"x-switchboard-session-key": "project-x"}) == (
        "agent:ops:project-x"
    )
    assert send("two", headers={"x-openclaw-session-key": "agent:ops:legacy"}) == (
        "agent:ops:legacy"
    )
    both = {"x-switchboard-session-key": "project-x"}
    assert send("three", headers=both, who="alice") == "agent:ops:project-x"
    assert send("four", who="alice") == "agent:ops:openai-user:alice"
    assert send("five", who="alice") == "agent:ops:openai-user:alice"
    hashed = hashlib.sha256(b"Alice Smith").hexdigest()[:32]
    assert send("six", who="Alice Smith") == f"agent:ops:openai-user:u-{hashed}"
    assert send("seven") == "agent:ops:main"

    def sent(key: str) -> list[str]:
        return [text for role, text in history(rpc, key) if role == "user"]

    assert sent("agent:ops:project-x") == ["one", "three"]
    assert sent("agent:ops:legacy") == ["two"]
    assert sent("agent:ops:openai-user:alice") == ["four", "five"]
    assert sent(f"agent:ops:openai-user:u-{hashed}") == ["six"]
    assert sent("agent:ops:main") == ["seven"]
    assert sent("agent:main:main") == []

    with pytest.raises(openai.BadRequestError) as err:
        send("other agent", headers={"x-switchboard-session-key": "agent:main:main"})
    assert err.value.param == "x-switchboard-session-key"
    assert 'not a session of the model\'s agent "ops"' in err.value.message


def test_bad_requests_answer_openai_errors_and_change_nothing(
    api_url: str, oa: openai.OpenAI, client: httpx.Client, rpc: Callable[..., Any]
) -> None:
    """Unknown model 404, bad input 400, wrong key 401, denied 403 — all in OpenAI's shape."""
    for model in ("gpt-4o", "switchboard/nobody", "switchboard"):
        with pytest.raises(openai.NotFoundError) as nf:
            oa.chat.completions.create(model=model, messages=[user("hi")])
        assert nf.value.code == "model_not_found"
        assert isinstance(nf.value.body, dict)
        assert set(nf.value.body) == {"message", "type", "param", "code"}
        assert "switchboard/main, switchboard/ops" in nf.value.message

    bad_messages: list[Any] = [
        [{"role": "system", "content": "no user message"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [user("   ")],
        [{"role": "wizard", "content": "hi"}],
    ]
    for messages in bad_messages:
        with pytest.raises(openai.BadRequestError) as br:
            oa.chat.completions.create(model="switchboard/main", messages=messages)
        assert br.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(model="switchboard/main", messages=[user("hi")], n=2)

    with pytest.raises(openai.PermissionDeniedError) as denied:
        oa.chat.completions.create(
            model="switchboard/ops",
            messages=[user("hi")],
            extra_headers={"x-switchboard-session-key": "blocked"},
        )
    assert denied.value.type == "permission_error"

    wrong = openai.OpenAI(base_url=f"{api_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        wrong.chat.completions.create(model="switchboard/main", messages=[user("hi")])
    assert auth.value.code == "invalid_api_key"
    assert isinstance(auth.value.body, dict)
    assert set(auth.value.body) == {"message", "type", "param", "code"}
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()

    resp = client.post("/v1/chat/completions", content=b"{not json")
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "request body is not valid JSON"
    assert rpc("sessions.list")["count"] == 0


def test_failed_and_timed_out_runs_are_errors_not_retried(worker: Any, oa: openai.OpenAI) -> None:
    """A failed run is 502, a run past its deadline 504, streamed as an error event."""
    with pytest.raises(openai.APIStatusError) as failed:
        oa.chat.completions.create(model="switchboard/main", messages=[user("/fail boom")])
    assert failed.value.status_code == 502
    assert failed.value.code == "run_failed" and "boom" in failed.value.message
    assert failed.value.response.headers["x-should-retry"] == "false"

    stream = oa.chat.completions.create(
        model="switchboard/main", messages=[user("/fail again")], stream=True
    )
    with pytest.raises(openai.APIError) as streamed:
        list(stream)
    assert "again" in streamed.value.message

    start = time.monotonic()
    with pytest.raises(openai.APIStatusError) as late:
        oa.chat.completions.create(model="switchboard/main", messages=[user("/sleep 20")])
    assert late.value.status_code == 504 and late.value.code == "run_timeout"
    assert time.monotonic() - start < 15


def test_owner_send_command_answers_at_once_and_the_policy_holds(
    worker: Any, oa: openai.OpenAI
) -> None:
    """`/send off` sets the session's override without a run; the next message is denied."""
    reply = oa.chat.completions.create(
        model="switchboard/ops", messages=[user("/send off")], user="bob"
    )
    assert reply.choices[0].message.content
    assert reply.usage is None
    with pytest.raises(openai.PermissionDeniedError):
        oa.chat.completions.create(model="switchboard/ops", messages=[user("hi")], user="bob")
    ok = oa.chat.completions.create(model="switchboard/ops", messages=[user("hi")], user="carol")
    assert ok.choices[0].message.content == "hi"
