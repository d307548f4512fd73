"""OpenAI Responses API: `POST /v1/responses`, `GET /v1/responses/{id}`, `…/{id}/cancel`.

A response is one run of the model's agent (`switchboard/<agentId>`), with the id
``resp_<runId>``. `previous_response_id` continues that response's session; without it
the session header (as for chat completions) names the session, else each response opens
a new session of the agent (`agent:<agentId>:openai-response:<hex>`). As for chat
completions, only the last user message of `input` is sent (the session keeps its own
transcript); `instructions` and system/developer input messages are extra instructions for
this run. A response's record (`ResponseStore`) says what its id names; its status,
output and usage are its run's, read when asked for. `stream: true` answers with the
standard `response.*` Server-Sent Events; `background: true` answers at once (`queued`)
and `GET /v1/responses/{id}` tells how it is going; cancelling stops the run as
`subagents cancel` does (`runtime.cancel`). Errors answer in OpenAI's shape.

Function `tools` are client-side tools (`api.client_tools`): a call of one ends the run,
answered as `function_call` output items; `function_call_output` input items (with
`previous_response_id`) carry their results and continue the session.
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from switchboard.api.auth import require_token
from switchboard.api.body import json_body_schema
from switchboard.api.client_tools import (
    ResponsesTool,
    continuation,
    function_call_events,
    responses_tools,
    tools_field,
)
from switchboard.api.openai_compat import (
    PING_INTERVAL_S,
    WAIT_GRACE_S,
    ContentPart,
    OpenAIError,
    OpenAIRoute,
    agent_for_model,
    as_openai_error,
    check_acting_agent,
    check_acting_session,
    header_session,
    parse_openai_body,
)
from switchboard.api.scopes import principal_of
from switchboard.shared import keys as sk
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.gateway.openai_bodies import (
    RESPONSE_PREFIX,
    ResponseStatus,
    as_json,
    failure_text,
    message_id,
    message_item,
    model_id,
    response_object,
    status_of,
)
from switchboard.shared.gateway.resolve import key_options
from switchboard.shared.runtime.cancel import cancel_run
from switchboard.shared.services import Services
from switchboard.shared.store.responses import ResponseRecord
from switchboard.shared.store.runs import RunRecord, now_ms

SESSION_SEGMENT = "openai-response"
# How long a cancel waits for the worker executing the run to stop it (it looks once a second).
CANCEL_WAIT_S = 10.0
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
# The user message is in the transcript once the run started: clients must not retry.
_NO_RETRY = {"x-should-retry": "false"}

router = APIRouter(route_class=OpenAIRoute)


class InputItem(BaseModel):
    """One input item: a message (`type` "message" or left out), a client tool's result
    (`function_call_output`), or the call it answers (`function_call`, ignored: the
    session has it)."""

    model_config = ConfigDict(extra="ignore")

    type: StrictStr | None = Field(default=None, max_length=64)
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: StrictStr | list[ContentPart] | None = None
    call_id: StrictStr | None = Field(default=None, max_length=256)
    output: StrictStr | list[ContentPart] | None = None


class ResponseCreateRequest(BaseModel):
    """`POST /v1/responses`; sampling parameters and text formats are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr = Field(max_length=256, description="switchboard/<agentId>")
    input: StrictStr | list[InputItem]
    instructions: StrictStr | None = None
    previous_response_id: StrictStr | None = Field(default=None, max_length=256)
    stream: StrictBool | None = None
    background: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = Field(default=None, max_length=16)
    tools: list[ResponsesTool] | None = tools_field()
    tool_choice: StrictStr | dict[str, Any] | None = None


def _part_text(item: InputItem, index: int, *, output: bool = False) -> str:
    content = item.output if output else item.content
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type not in _TEXT_PARTS:
            raise OpenAIError(
                400,
                f"Unsupported content part type {part.type!r}: only input_text is accepted",
                code="invalid_value",
                param=f"input[{index}].content[{j}].type",
            )
        texts.append(part.text or "")
    return "\n".join(texts)


def request_text(body: ResponseCreateRequest) -> tuple[str, str | None, list[tuple[str, str]]]:
    """(The text sent to the session: the last user message, or '' when
    `function_call_output` items follow it; the run's extra instructions: `instructions`
    and the input's system and developer messages; the client's tool results, as (call
    id, output), that follow the last user message)."""
    extra = [body.instructions or ""]
    results: list[tuple[str, str]] = []
    if isinstance(body.input, str):
        text = body.input
    else:
        user: str | None = None
        for i, item in enumerate(body.input):
            if item.type == "function_call":
                continue
            if item.type == "function_call_output":
                if not item.call_id:
                    raise OpenAIError(
                        400,
                        "Missing required parameter: a function_call_output needs its call_id",
                        code="missing_required_parameter",
                        param=f"input[{i}].call_id",
                    )
                results.append((item.call_id, _part_text(item, i, output=True)))
                continue
            if item.type not in (None, "message"):
                raise OpenAIError(
                    400,
                    f"Unsupported input item type {item.type!r}: only messages are accepted",
                    code="invalid_value",
                    param=f"input[{i}].type",
                )
            if item.role is None:
                raise OpenAIError(
                    400,
                    "Missing required parameter: a message needs a role",
                    code="missing_required_parameter",
                    param=f"input[{i}].role",
                )
            if item.role == "user":
                user, results = _part_text(item, i), []
            elif item.role in ("system", "developer"):
                extra.append(_part_text(item, i))
        if results:  # the client's results continue the session: no user message
            return "", "\n\n".join(t for t in extra if t.strip()) or None, results
        if user is None:
            raise OpenAIError(400, "input must contain a user message", param="input")
        text = user
    if not text.strip():
        raise OpenAIError(400, "the input's user message is empty", param="input")
    joined = "\n\n".join(t for t in extra if t.strip())
    return text, joined or None, results


def previous_response(svc: Services, response_id: str, agent_id: str) -> ResponseRecord:
    """The response `previous_response_id` names: one of the model's agent, else an error."""
    rec = _lookup(svc, response_id)
    if rec is None:
        raise OpenAIError(
            404,
            f"Previous response with id '{response_id}' not found.",
            param="previous_response_id",
        )
    if rec.agent_id != agent_id:
        raise OpenAIError(
            400,
            f"Previous response '{response_id}' was answered by model "
            f"'{model_id(rec.agent_id)}', not by '{model_id(agent_id)}'",
            param="previous_response_id",
        )
    return rec


def _lookup(svc: Services, response_id: str) -> ResponseRecord | None:
    if not response_id.startswith(RESPONSE_PREFIX) or len(response_id) > 256:
        return None
    return svc.store.responses.get(response_id)


def new_session(svc: Services, agent_id: str, idempotency_key: str | None) -> str:
    """A new session of the agent, for a response that continues none. With an
    idempotency key it is named after it, so a retry finds its first try's run there."""
    if idempotency_key:
        name = hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
    else:
        name = uuid.uuid4().hex
    return sk.canonical_key(f"{SESSION_SEGMENT}:{name}", agent_id=agent_id, **key_options(svc))


def _headers(rec: ResponseRecord) -> dict[str, str]:
    out = {"x-switchboard-session-key": rec.session_key}
    if rec.run_id:
        out["x-switchboard-run-id"] = rec.run_id
    return out


def _wait_s(svc: Services) -> float:
    return float(svc.config.runs.timeout_seconds) + WAIT_GRACE_S


def _still_running(rec: ResponseRecord, wait_s: float, run: RunRecord | None) -> str:
    state = status_of(rec, run)
    return (
        f"no reply within {wait_s:g} s: response {rec.response_id} is still {state}; "
        f"GET /v1/responses/{rec.response_id} answers once it ends"
    )


async def _await_end(request: Request, rec: ResponseRecord, wait_s: float) -> RunRecord | None:
    """The response's run once it ended (or as it is when ``wait_s`` passes); None
    without a run, or when the run's record is gone."""
    if rec.run_id is None:
        return None
    state = request.app.state
    run: RunRecord | None = await state.waiter.wait(rec.run_id, wait_s, state.fetch_run)
    if run is None:
        raise _expired(rec.response_id)
    return run


def _expired(response_id: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The output of response '{response_id}' is no longer kept "
        "(runs are kept runs.retentionHours)",
        code="response_expired",
    )


def _not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id}' not found.", code="not_found")


async def response_events(
    request: Request,
    rec: ResponseRecord,
    wait_s: float,
    starting_after: int | None = None,
) -> AsyncIterator[ServerSentEvent]:
    """`response.created`, `response.in_progress`, then once the run ends the output's
    events and `response.completed` (or `response.failed`), numbered from 0 by
    `sequence_number`; the events up to ``starting_after`` are left out (a resumed stream).
    A run still going when the wait ends is an `error` event (the run goes on)."""
    seq = itertools.count()
    after = -1 if starting_after is None else starting_after

    def event(make: Callable[[int], BaseModel]) -> ServerSentEvent | None:
        n = next(seq)
        if n <= after:
            return None
        obj = make(n)
        return ServerSentEvent(
            event=str(getattr(obj, "type", "")), data=obj.model_dump_json(exclude_unset=True)
        )

    def events(*makers: Callable[[int], BaseModel]) -> list[ServerSentEvent]:
        return [e for e in (event(m) for m in makers) if e is not None]

    first: ResponseStatus = "queued" if rec.background else "in_progress"
    for sse in events(
        lambda n: ResponseCreatedEvent(
            type="response.created",
            sequence_number=n,
            response=response_object(rec, None, first),
        ),
        lambda n: ResponseInProgressEvent(
            type="response.in_progress",
            sequence_number=n,
            response=response_object(rec, None, "in_progress"),
        ),
    ):
        yield sse
    try:
        run = await _await_end(request, rec, wait_s)
        status = status_of(rec, run)
        if run is not None and not run.terminal:
            raise OpenAIError(504, _still_running(rec, wait_s, run), code="run_pending")
    except Exception as exc:
        err = as_openai_error(exc)
        for sse in events(
            lambda n: ResponseErrorEvent(
                type="error",
                sequence_number=n,
                code=err.code,
                message=err.message,
                param=err.param,
            )
        ):
            yield sse
        return
    if status != "completed":
        for sse in events(
            lambda n: ResponseFailedEvent(
                type="response.failed", sequence_number=n, response=response_object(rec, run)
            )
        ):
            yield sse
        return
    final = response_object(rec, run)
    text = final.output_text
    item_id = message_id(rec)
    part = ResponseOutputText(type="output_text", text="", annotations=[])
    whole = ResponseOutputText(type="output_text", text=text, annotations=[])
    where: dict[str, Any] = {"item_id": item_id, "output_index": 0, "content_index": 0}
    makers: list[Callable[[int], BaseModel]] = [
        lambda n: ResponseOutputItemAddedEvent(
            type="response.output_item.added",
            sequence_number=n,
            output_index=0,
            item=message_item(rec, None, False),
        ),
        lambda n: ResponseContentPartAddedEvent(
            type="response.content_part.added", sequence_number=n, part=part, **where
        ),
    ]
    if text:
        makers.append(
            lambda n: ResponseTextDeltaEvent(
                type="response.output_text.delta",
                sequence_number=n,
                delta=text,
                logprobs=[],
                **where,
            )
        )
    makers += [
        lambda n: ResponseTextDoneEvent(
            type="response.output_text.done", sequence_number=n, text=text, logprobs=[], **where
        ),
        lambda n: ResponseContentPartDoneEvent(
            type="response.content_part.done", sequence_number=n, part=whole, **where
        ),
        lambda n: ResponseOutputItemDoneEvent(
            type="response.output_item.done",
            sequence_number=n,
            output_index=0,
            item=message_item(rec, text, True),
        ),
    ]
    calls = run.tool_calls if run is not None else []
    if calls:  # the client's calls, after what the model said with them (if anything)
        makers = [*(makers if text else []), *function_call_events(calls, 1 if text else 0)]
    makers.append(
        lambda n: ResponseCompletedEvent(
            type="response.completed", sequence_number=n, response=final
        )
    )
    for sse in events(*makers):
        yield sse


def _stream(request: Request, rec: ResponseRecord, starting_after: int | None) -> Response:
    svc: Services = request.app.state.services
    return EventSourceResponse(
        response_events(request, rec, _wait_s(svc), starting_after),
        headers=_headers(rec),
        ping=PING_INTERVAL_S,
        sep="\n",
    )


def _outcome_error(rec: ResponseRecord, run: RunRecord, wait_s: float) -> OpenAIError | None:
    """The error a waiting caller gets for a run that did not end `ok`, if it did not."""
    headers = {**_NO_RETRY, **_headers(rec)}
    if run.status == "ok":
        return None
    if run.status == "cancelled":
        msg = f"response {rec.response_id} was cancelled"
        return OpenAIError(502, msg, "server_error", code="response_cancelled", headers=headers)
    if run.status in ("error", "lost"):
        return OpenAIError(
            502, failure_text(run), "server_error", code="run_failed", headers=headers
        )
    if run.status == "timeout":
        return OpenAIError(
            504, failure_text(run), "server_error", code="run_timeout", headers=headers
        )
    msg = _still_running(rec, wait_s, run)
    return OpenAIError(504, msg, "server_error", code="run_pending", headers=headers)


@router.post(
    "/v1/responses",
    dependencies=[Depends(require_token)],
    openapi_extra=json_body_schema(ResponseCreateRequest),
    response_model=None,
)
async def create_response(request: Request) -> Response:
    """Send the input's last user message to the agent's session as one response."""
    body = await parse_openai_body(request, ResponseCreateRequest)
    svc: Services = request.app.state.services
    agent_id = agent_for_model(svc, body.model)
    text, extra, given = request_text(body)
    tools, choice = responses_tools(svc, body.tools, body.tool_choice)
    principal = principal_of(request)
    check_acting_agent(request, principal, agent_id)
    idempotency_key = request.headers.get("idempotency-key") or None
    previous = None
    if body.previous_response_id is not None:
        previous = await run_in_threadpool(
            previous_response, svc, body.previous_response_id, agent_id
        )
        key = previous.session_key
    else:
        named = await run_in_threadpool(header_session, svc, agent_id, request.headers)
        key = named or principal.session_key or new_session(svc, agent_id, idempotency_key)
    check_acting_session(request, principal, key)
    results: list[dict[str, Any]] = []
    if given:  # the client's tool results continue the session's last run
        cont = await run_in_threadpool(continuation, svc, key, given, field="input")
        results, idempotency_key = cont.results, cont.idempotency_key
    started = await run_in_threadpool(
        start_run,
        svc,
        RunRequest(
            session_key=key,
            message=text,
            channel="webchat",
            idempotency_key=idempotency_key,
            extra_system_prompt=extra,
            provenance={"kind": "external_user", "sourceChannel": "webchat"},
            owner=principal.is_owner,
            client_tools=tools,
            tool_choice=choice,
            tool_results=results,
        ),
    )
    run_id = started.get("runId")
    rec = ResponseRecord(
        response_id=f"{RESPONSE_PREFIX}{run_id or uuid.uuid4()}",
        session_key=key,
        agent_id=agent_id,
        created_at_ms=now_ms(),
        run_id=str(run_id) if run_id else None,
        previous_response_id=previous.response_id if previous else None,
        instructions=body.instructions,
        background=bool(body.background),
        metadata=body.metadata or {},
        # Without a run id the message was an owner command (`/send on`), answered at once.
        reply=None if run_id else str(started.get("reply", "")),
    )
    await run_in_threadpool(svc.store.responses.put, rec)
    if body.stream:
        return _stream(request, rec, None)
    if rec.background or rec.run_id is None:
        return JSONResponse(as_json(response_object(rec, None)), headers=_headers(rec))
    wait_s = _wait_s(svc)
    run = await _await_end(request, rec, wait_s)
    assert run is not None  # a response with a run
    err = _outcome_error(rec, run, wait_s)
    if err is not None:
        raise err
    return JSONResponse(as_json(response_object(rec, run)), headers=_headers(rec))


async def _response_and_run(
    request: Request, response_id: str
) -> tuple[ResponseRecord, RunRecord | None]:
    svc: Services = request.app.state.services
    rec = await run_in_threadpool(_lookup, svc, response_id)
    if rec is None or not principal_of(request).sees(rec.session_key):
        raise _not_found(response_id)  # another scope's response reads as unknown
    check_acting_session(request, principal_of(request), rec.session_key)
    if rec.run_id is None:
        return rec, None
    run: RunRecord | None = await request.app.state.fetch_run(rec.run_id)
    if run is None:
        raise _expired(response_id)
    return rec, run


@router.get(
    "/v1/responses/{response_id}", dependencies=[Depends(require_token)], response_model=None
)
async def retrieve_response(
    response_id: str,
    request: Request,
    stream: bool = False,
    starting_after: int | None = None,
) -> Response:
    """The response as it stands; with `stream=true`, its events (after `starting_after`),
    following the run to its end."""
    rec, run = await _response_and_run(request, response_id)
    if stream:
        return _stream(request, rec, starting_after)
    return JSONResponse(as_json(response_object(rec, run)), headers=_headers(rec))


@router.post(
    "/v1/responses/{response_id}/cancel",
    dependencies=[Depends(require_token)],
    response_model=None,
)
async def cancel_response(response_id: str, request: Request) -> Response:
    """Cancel a queued or running response (its run ends `cancelled`); a cancelled one is
    answered as it is, a finished one is a 400."""
    rec, run = await _response_and_run(request, response_id)
    status = status_of(rec, run)
    if rec.run_id is not None and status in ("queued", "in_progress"):
        svc: Services = request.app.state.services
        res = await run_in_threadpool(cancel_run, svc, rec.run_id, rec.session_key)
        if res.verdict == "cancelled":
            run = res.run
        else:  # 'requested': its worker stops it within a second; 'ended' meanwhile
            state = request.app.state
            run = await state.waiter.wait(rec.run_id, CANCEL_WAIT_S, state.fetch_run)
            if run is None:
                raise _expired(response_id)
        status = status_of(rec, run)
    if status not in ("cancelled", "queued", "in_progress"):
        raise OpenAIError(
            400, f"Cannot cancel a {status} response.", code="invalid_state", param="response_id"
        )
    return JSONResponse(as_json(response_object(rec, run)), headers=_headers(rec))
