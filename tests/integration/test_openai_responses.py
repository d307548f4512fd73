"""The OpenAI Responses API, driven by the real `openai` client against the api and a worker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from switchboard.shared.config import Settings
from switchboard.shared.services import Services

pytestmark = pytest.mark.integration

STREAM_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]
# What an error message must never show: validation internals of the request models.
INTERNALS = ("list[", "InputItem", "InputPart", "ContentPart", "Strict", "params", "body.")


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Two agents; a run deadline long enough for a slow run to be cancelled."""
    return {
        "agents": {"list": [{"id": "main", "default": True}, {"id": "ops"}]},
        "runs": {"timeoutSeconds": 30},
    }


@pytest.fixture
def oa(api_url: str, settings: Settings) -> Iterator[openai.OpenAI]:
    """The real OpenAI client pointed at the api (no retries: every answer is seen)."""
    with openai.OpenAI(
        base_url=f"{api_url}/v1", api_key=settings.token, max_retries=0, timeout=60
    ) as client:
        yield client


def history(rpc: Callable[..., Any], key: str) -> list[tuple[str, str]]:
    """A session's transcript as (role, text) pairs."""
    out = []
    for m in rpc("chat.history", sessionKey=key)["messages"]:
        content = m["content"]
        text = content if isinstance(content, str) else "".join(b["text"] for b in content)
        out.append((m["role"], text))
    return out


def until(oa: openai.OpenAI, response_id: str, done: Callable[[Response], bool]) -> Response:
    """Retrieve the response until ``done`` says so (at most 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        resp = oa.responses.retrieve(response_id)
        if done(resp):
            return resp
        assert time.monotonic() < deadline, f"response still {resp.status}"
        time.sleep(0.1)


def test_create_then_continue_with_previous_response_id(
    worker: Any, oa: openai.OpenAI, rpc: Callable[..., Any], services: Services
) -> None:
    """A response opens a session; `previous_response_id` continues it; retrieve reads it."""
    raw = oa.responses.with_raw_response.create(
        model="switchboard/main", input="hello there", instructions="Be brief."
    )
    first = raw.parse()
    run_id = raw.headers["x-switchboard-run-id"]
    key = raw.headers["x-switchboard-session-key"]
    assert first.id == f"resp_{run_id}"
    assert key.startswith("agent:main:openai-response:")
    assert (first.object, first.status, first.model) == (
        "response",
        "completed",
        "switchboard/main",
    )
    assert first.output_text == "hello there"
    assert first.instructions == "Be brief." and first.previous_response_id is None
    assert first.background is False and first.error is None
    assert first.usage is not None
    assert (first.usage.input_tokens, first.usage.output_tokens) == (2, 2)
    assert first.usage.total_tokens == 4
    run = services.store.runs.get(run_id)
    assert run is not None and run.extra_system_prompt == "Be brief."

    raw = oa.responses.with_raw_response.create(
        model="switchboard/main",
        input=[
            {"role": "developer", "content": "Answer in English."},
            {"role": "user", "content": [{"type": "input_text", "text": "and again"}]},
        ],
        previous_response_id=first.id,
    )
    second = raw.parse()
    assert raw.headers["x-switchboard-session-key"] == key
    assert second.previous_response_id == first.id and second.instructions is None
    assert second.output_text == "and again"
    # echo counts the words the model saw: the session's earlier turn is in its context.
    assert second.usage is not None and second.usage.input_tokens == 2 + 2 + 2
    assert history(rpc, key) == [
        ("user", "hello there"),
        ("assistant", "hello there"),
        ("user", "and again"),
        ("assistant", "and again"),
    ]
    second_run = services.store.runs.get(raw.headers["x-switchboard-run-id"])
    assert second_run is not None and second_run.extra_system_prompt == "Answer in English."

    raw = oa.responses.with_raw_response.create(model="switchboard/main", input="fresh")
    assert raw.headers["x-switchboard-session-key"] not in (key, "agent:main:main")
    third = raw.parse()
    assert third.usage is not None and third.usage.input_tokens == 1  # a new session

    again = oa.responses.retrieve(first.id)
    assert again.model_dump(exclude={"usage"}) == first.model_dump(exclude={"usage"})
    assert again.usage == first.usage
    retried = [
        oa.responses.create(
            model="switchboard/main",
            input="once only",
            extra_headers={"Idempotency-Key": "order-7"},
        )
        for _ in range(2)
    ]
    assert retried[0].id == retried[1].id and retried[1].output_text == "once only"
    named = oa.responses.with_raw_response.create(
        model="switchboard/main",
        input="to a named session",
        extra_headers={"x-switchboard-session-key": "project-x"},
    )
    assert named.headers["x-switchboard-session-key"] == "agent:main:project-x"


def test_streaming_yields_the_standard_events_in_sequence(
    worker: Any, oa: openai.OpenAI, client: httpx.Client
) -> None:
    """`stream=True`: the `response.*` events numbered from 0; the SDK's stream helper
    accumulates them; a stream resumes after a sequence number."""
    events = list(
        oa.responses.create(model="switchboard/ops", input="streamed reply here", stream=True)
    )
    assert [e.type for e in events] == STREAM_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(STREAM_EVENTS)))
    created, in_progress, *_, completed = events
    assert created.type == "response.created" and created.response.status == "in_progress"
    assert in_progress.type == "response.in_progress"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "streamed reply here"
    assert completed.type == "response.completed"
    final = completed.response
    assert final.status == "completed" and final.output_text == "streamed reply here"
    assert final.usage is not None and final.usage.output_tokens == 3
    assert {e.response.id for e in (created, in_progress, completed)} == {final.id}

    with oa.responses.stream(model="switchboard/ops", input="via the helper") as stream:
        assert stream.get_final_response().output_text == "via the helper"

    resumed = list(oa.responses.retrieve(final.id, stream=True, starting_after=5))
    assert [e.type for e in resumed] == STREAM_EVENTS[6:]
    assert [e.sequence_number for e in resumed] == [6, 7, 8]
    with oa.responses.stream(response_id=final.id) as again:
        assert again.get_final_response().output_text == "streamed reply here"

    body = {"model": "switchboard/ops", "input": "raw", "stream": True}
    with client.stream("POST", "/v1/responses", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert names == STREAM_EVENTS
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data:")]
    assert [(d["type"], d["sequence_number"]) for d in data] == list(
        zip(STREAM_EVENTS, range(len(STREAM_EVENTS)), strict=True)
    )
    assert data[-1]["response"]["output"][0]["content"][0]["text"] == "raw"


def test_background_response_is_retrieved_until_completed(worker: Any, oa: openai.OpenAI) -> None:
    """`background=True` answers at once, queued; retrieve follows the run to its end."""
    resp = oa.responses.create(
        model="switchboard/main",
        input="/sleep 1\nbackground hi",
        background=True,
        metadata={"ticket": "42"},
    )
    # Answered before the run ended (waiting for it would have answered `completed`).
    assert resp.status == "queued" and resp.background is True
    assert resp.output == [] and resp.usage is None
    running = until(oa, resp.id, lambda r: r.status != "queued")
    assert running.status in ("in_progress", "completed")
    done = until(oa, resp.id, lambda r: r.status == "completed")
    assert done.output_text == "background hi"
    assert done.metadata == {"ticket": "42"} and done.background is True
    assert done.usage is not None and done.usage.output_tokens == 2
    assert done.completed_at is not None and done.completed_at >= done.created_at


def test_cancel_ends_a_slow_run_and_a_queued_one(worker: Any, oa: openai.OpenAI) -> None:
    """Cancel stops a running background response and a queued one behind it; the session
    goes on; a finished response cannot be cancelled."""
    slow = oa.responses.create(model="switchboard/main", input="/sleep 20\nslow", background=True)
    until(oa, slow.id, lambda r: r.status == "in_progress")
    behind = oa.responses.create(
        model="switchboard/main",
        input="queued behind",
        previous_response_id=slow.id,
        background=True,
    )
    assert oa.responses.retrieve(behind.id).status == "queued"

    start = time.monotonic()
    queued = oa.responses.cancel(behind.id)
    assert queued.status == "cancelled" and queued.error is None
    running = oa.responses.cancel(slow.id)
    assert running.status == "cancelled" and running.output == []
    assert time.monotonic() - start < 8  # the worker stops it within about a second
    assert oa.responses.retrieve(slow.id).status == "cancelled"
    assert oa.responses.cancel(slow.id).status == "cancelled"  # again: as it is

    after = oa.responses.create(
        model="switchboard/main", input="after the cancel", previous_response_id=slow.id
    )
    assert after.output_text == "after the cancel"
    with pytest.raises(openai.BadRequestError) as finished:
        oa.responses.cancel(after.id)
    assert "completed" in finished.value.message


def test_failed_runs_answer_errors_and_failed_responses(worker: Any, oa: openai.OpenAI) -> None:
    """A failed run: 502 when waited for, `failed` when retrieved, `response.failed` streamed."""
    with pytest.raises(openai.APIStatusError) as failed:
        oa.responses.create(model="switchboard/main", input="/fail boom")
    assert failed.value.status_code == 502 and failed.value.code == "run_failed"
    assert "boom" in failed.value.message
    assert failed.value.response.headers["x-should-retry"] == "false"

    resp = oa.responses.create(model="switchboard/main", input="/fail later", background=True)
    ended = until(oa, resp.id, lambda r: r.status not in ("queued", "in_progress"))
    assert ended.status == "failed" and ended.error is not None
    assert ended.error.code == "server_error" and "later" in ended.error.message

    events = list(oa.responses.create(model="switchboard/main", input="/fail again", stream=True))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    assert events[-1].type == "response.failed"
    assert events[-1].response.error is not None and "again" in events[-1].response.error.message


def test_bad_requests_answer_openai_errors_without_internals(
    api_url: str, oa: openai.OpenAI, client: httpx.Client, rpc: Callable[..., Any]
) -> None:
    """Unknown model 404, bad input 400, unknown ids 404, wrong key 401: OpenAI's shape,
    naming the request's own parameters; nothing is started."""
    with pytest.raises(openai.NotFoundError) as nf:
        oa.responses.create(model="gpt-4o", input="hi")
    assert nf.value.code == "model_not_found" and nf.value.param == "model"
    assert isinstance(nf.value.body, dict)
    assert set(nf.value.body) == {"message", "type", "param", "code"}

    bad: list[tuple[Any, str]] = [
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "input[0]"),
        ([{"type": "computer_call_output", "call_id": "c", "output": "x"}], "input[0].type"),
        ([{"type": "function_call_output", "call_id": "c", "output": "x"}], "input"),
        ([{"role": "system", "content": "no user message"}], "input"),
        ([{"role": "wizard", "content": "hi"}], "input[0].role"),
        ([{"role": "user", "content": 5}], "input[0].content"),
        (5, "input"),
        ("   ", "input"),
    ]
    for value, param in bad:
        with pytest.raises(openai.BadRequestError) as br:
            oa.responses.create(model="switchboard/main", input=value)
        assert br.value.type == "invalid_request_error"
        assert br.value.param is not None and br.value.param.startswith(param), br.value.param
        assert not any(word in br.value.message for word in INTERNALS), br.value.message
    resp = client.post("/v1/responses", json={"model": "switchboard/main"})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "input"
    assert resp.json()["error"]["code"] == "missing_required_parameter"
    resp = client.post("/v1/responses", content=b"{not json")
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "request body is not valid JSON"

    with pytest.raises(openai.NotFoundError) as unknown_prev:
        oa.responses.create(model="switchboard/main", input="hi", previous_response_id="resp_x")
    assert unknown_prev.value.param == "previous_response_id"
    resp = client.get("/v1/responses/resp_x", params={"starting_after": "soon"})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "starting_after"
    assert "query" not in resp.json()["error"]["message"]
    for call in (oa.responses.retrieve, oa.responses.cancel):
        with pytest.raises(openai.NotFoundError):
            call("resp_nope")
    assert rpc("sessions.list")["count"] == 0

    wrong = openai.OpenAI(base_url=f"{api_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        wrong.responses.create(model="switchboard/main", input="hi")
    assert auth.value.code == "invalid_api_key"


def test_previous_response_of_another_agent_is_refused(worker: Any, oa: openai.OpenAI) -> None:
    """A response of one agent cannot be continued through another agent's model."""
    first = oa.responses.create(model="switchboard/ops", input="hi")
    with pytest.raises(openai.BadRequestError) as other:
        oa.responses.create(model="switchboard/main", input="hi", previous_response_id=first.id)
    assert other.value.param == "previous_response_id"
    assert "switchboard/ops" in other.value.message


def test_chat_completions_n_error_names_only_the_parameter(
    oa: openai.OpenAI, client: httpx.Client
) -> None:
    """`n=2` and malformed messages on chat completions: a 400 naming the request's own
    parameter, never the request models' internals."""
    with pytest.raises(openai.BadRequestError) as n:
        oa.chat.completions.create(
            model="switchboard/main", messages=[{"role": "user", "content": "hi"}], n=2
        )
    assert n.value.param == "n" and n.value.code == "invalid_value"
    assert "only 1 is supported" in n.value.message
    assert not any(word in n.value.message for word in INTERNALS), n.value.message

    body = {"model": "switchboard/main", "messages": [{"role": "user", "content": [{"text": 5}]}]}
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"].startswith("messages[0].content")
    assert not any(word in error["message"] for word in INTERNALS), error["message"]


def test_the_openai_agents_sdk_runs_an_agent_against_switchboard(
    worker: Any, api_url: str, settings: Settings, rpc: Callable[..., Any], services: Services
) -> None:
    """The OpenAI Agents SDK (its default model: the Responses API) runs an Agent whose model
    is a Switchboard agent: plain and streamed, a second turn continuing the first's session
    by `previous_response_id`."""
    import asyncio

    import agents

    async def run() -> tuple[Any, Any, str]:
        client = openai.AsyncOpenAI(
            base_url=f"{api_url}/v1", api_key=settings.token, max_retries=0, timeout=60
        )
        model = agents.OpenAIResponsesModel(model="switchboard/main", openai_client=client)
        agent = agents.Agent(name="helper", instructions="Be brief.", model=model)
        config = agents.RunConfig(tracing_disabled=True)
        first = await agents.Runner.run(agent, "hello from the agents sdk", run_config=config)
        streamed = agents.Runner.run_streamed(
            agent,
            "and a streamed turn",
            run_config=config,
            previous_response_id=first.last_response_id,
        )
        deltas = [
            event.data.delta
            async for event in streamed.stream_events()
            if event.type == "raw_response_event"
            and event.data.type == "response.output_text.delta"
        ]
        await client.close()
        return first, streamed, "".join(deltas)

    first, streamed, deltas = asyncio.run(run())
    assert first.final_output == "hello from the agents sdk"
    assert streamed.final_output == "and a streamed turn" == deltas
    assert first.last_response_id and first.last_response_id.startswith("resp_")
    # The second turn went into the first turn's session: both are in one transcript.
    run_id = first.last_response_id.removeprefix("resp_")
    record = services.store.runs.get(run_id)
    assert record is not None
    key = record.session_key
    said = [text for role, text in history(rpc, key) if role == "user"]
    assert said == ["hello from the agents sdk", "and a streamed turn"]
