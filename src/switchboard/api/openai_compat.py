"""OpenAI-compatible `POST /v1/chat/completions` and `GET /v1/models`: talk to an agent's session.

`model` is `switchboard/<agentId>`. The session is the `x-switchboard-session-key` header
(or `x-openclaw-session-key`), else `agent:<agentId>:openai-user:<user>` derived from the
request's `user`, else the agent's main session. Only the last user message is sent: the
session keeps its own transcript, earlier request messages are not replayed. The reply is
the run's outcome, awaited without blocking (the api's RunWaiter). Errors answer in
OpenAI's shape `{"error": {"message", "type", "param", "code"}}`.

Function `tools` (and `tool_choice`) are client-side tools (`api.client_tools`): a call of
one ends the run, answered as `finish_reason: "tool_calls"`; a request ending with `tool`
messages carries their results, and continues the session.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from openai.types import CompletionUsage, Model
from openai.types.chat import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from switchboard.api.auth import require_token
from switchboard.api.body import json_body_schema
from switchboard.api.client_tools import (
    ChatTool,
    chat_tool_deltas,
    chat_tools,
    continuation,
    tools_field,
)
from switchboard.api.errors import STATUS, openai_error_response
from switchboard.api.scopes import Principal, audit_note, principal_of
from switchboard.shared import keys as sk
from switchboard.shared.errors import (
    InvalidInput,
    StoreUnavailable,
    SwitchboardError,
    Unavailable,
)
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.gateway.openai_bodies import (
    MODEL_PREFIX,
    Turn,
    completion,
    model_id,
    usage_of,
)
from switchboard.shared.gateway.resolve import key_options, resolve_session_ref
from switchboard.shared.services import Services
from switchboard.shared.store.runs import RunRecord

log = logging.getLogger("switchboard.api")

SESSION_HEADERS = ("x-switchboard-session-key", "x-openclaw-session-key")
USER_SEGMENT = "openai-user"
# Waiting past the run's own deadline covers the time it may queue behind the session lane.
WAIT_GRACE_S = 30.0
PING_INTERVAL_S = 15
STARTED_AT = int(time.time())

_PLAIN_USER = re.compile(r"[a-z0-9_\-.@+=]{1,128}")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
}
# The user message is already in the transcript once a run started: a retry would send it
# again, so the OpenAI clients are told not to retry these.
_NO_RETRY = {"x-should-retry": "false"}


@dataclass(eq=False)
class OpenAIError(Exception):
    """An error answered in OpenAI's shape."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        """`{"error": {message, type, param, code}}`."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def as_openai_error(exc: Exception) -> OpenAIError:
    """Map any exception (domain, auth, validation, Redis) to an OpenAI-shaped error."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, SwitchboardError):
        status = next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 400)
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Unavailable) else {}
        if isinstance(exc, StoreUnavailable):
            log.warning("redis unavailable: %s", exc.__cause__)
        field_name = exc.fields.get("field")
        return OpenAIError(
            status,
            exc.message,
            _ERROR_TYPES.get(status, "server_error"),
            code=exc.kind,
            param=str(field_name) if field_name else None,
            headers=headers,
        )
    if isinstance(exc, StarletteHTTPException):
        code = "invalid_api_key" if exc.status_code == 401 else None
        return OpenAIError(
            exc.status_code,
            str(exc.detail),
            _ERROR_TYPES.get(exc.status_code, "server_error"),
            code=code,
            headers=dict(exc.headers or {}),
        )
    if isinstance(exc, RequestValidationError):
        # A query or path parameter (bodies are parsed by `parse_openai_body`): its location
        # starts with where it is ("query", "path"), which the request does not spell.
        errs = [(_param_path(tuple(err.get("loc", ()))[1:]), err) for err in exc.errors()]
        parts = [f"'{path}': {err.get('msg', 'invalid')}" for path, err in errs]
        return OpenAIError(
            400,
            "Invalid request: " + "; ".join(parts) if parts else "invalid request",
            code="invalid_value",
            param=errs[0][0] if errs else None,
        )
    log.exception("unhandled error", exc_info=exc)
    return OpenAIError(500, "internal error", "server_error", code="internal")


def error_response(err: OpenAIError) -> JSONResponse:
    """The error as an HTTP answer."""
    return openai_error_response(
        err.status,
        err.message,
        kind=err.type,
        code=err.code,
        param=err.param,
        headers=err.headers or None,
    )


class OpenAIRoute(APIRoute):
    """A route whose every error (auth, validation, domain) answers in OpenAI's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """Wrap FastAPI's handler so nothing reaches the contract's error handlers."""
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return error_response(as_openai_error(exc))

        return route


router = APIRouter(route_class=OpenAIRoute)


class ContentPart(BaseModel):
    """One part of a message's content; only `text` parts are understood."""

    model_config = ConfigDict(extra="ignore")

    type: StrictStr = Field(max_length=64)
    text: StrictStr | None = None


class ChatMessage(BaseModel):
    """One request message (an assistant's tool calls and names are accepted and ignored:
    the session has them)."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[ContentPart] | None = None
    tool_call_id: StrictStr | None = Field(default=None, max_length=256)


class StreamOptions(BaseModel):
    """`stream_options`."""

    model_config = ConfigDict(extra="ignore")

    include_usage: StrictBool | None = None


class ChatCompletionRequest(BaseModel):
    """A chat completion request; sampling parameters and formats are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr = Field(max_length=256, description="switchboard/<agentId>")
    messages: list[ChatMessage] = Field(min_length=1, max_length=10_000)
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    user: StrictStr | None = Field(default=None, max_length=512)
    n: StrictInt | None = None
    tools: list[ChatTool] | None = tools_field()
    tool_choice: StrictStr | dict[str, Any] | None = None


M = TypeVar("M", bound=BaseModel)
# Type names pydantic puts in an error's location (a union's branch: `str`,
# `list[ContentPart]`, `function-after[...]`); a body's own fields are snake_case words.
_FIELD_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _param_path(loc: tuple[int | str, ...]) -> str:
    """An error location as OpenAI names parameters (`messages[0].content`), without the
    type names of union branches."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _FIELD_NAME.fullmatch(part) and part not in _TYPE_NAMES:
            out += f".{part}" if out else part
    return out or "body"


def _error_code(kind: str) -> str:
    if kind == "missing":
        return "missing_required_parameter"
    if kind.endswith(("_type", "_parsing")) or kind in {"model_type", "list_type"}:
        return "invalid_type"
    return "invalid_value"


def body_error(exc: ValidationError) -> OpenAIError:
    """A 400 naming each bad parameter as the request spells it, and nothing else."""
    found = [
        (_param_path(tuple(err["loc"])), dict(err))
        for err in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
    problems: dict[str, list[dict[str, Any]]] = {}
    for path, err in found:
        # A union branch refusing the value's type, when another branch took the value
        # and found something wrong inside it, is noise: the inner problem is the one.
        inner = any(p.startswith((f"{path}[", f"{path}.")) for p, _ in found)
        if not (inner and str(err["type"]).endswith("_type")):
            problems.setdefault(path, []).append(err)
    parts = []
    for path, errs in problems.items():
        if errs[0]["type"] == "missing":
            parts.append(f"'{path}': missing required parameter")
            continue
        if len(errs) == 1:
            parts.append(f"'{path}': {errs[0]['msg']}")
            continue
        # Several: every branch of a union refused it ("Input should be a valid string",
        # "Input should be a valid array") — one sentence.
        said = [str(e["msg"]).removeprefix("Input should be ") for e in errs]
        parts.append(f"'{path}': Input should be " + " or ".join(dict.fromkeys(said)))
    first = next(iter(problems.values()))[0]
    return OpenAIError(
        400,
        "Invalid request: " + "; ".join(parts),
        code=_error_code(str(first["type"])),
        param=next(iter(problems)),
    )


async def parse_openai_body(request: Request, model: type[M]) -> M:
    """The JSON body validated as ``model``; a bad one is a 400 in OpenAI's terms."""
    raw = await request.body()
    if not raw:
        raise OpenAIError(400, "request body required (JSON object)", code="invalid_request")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise OpenAIError(400, "request body is not valid JSON", code="invalid_json") from None
        raise body_error(exc) from None


def agent_for_model(svc: Services, model: str) -> str:
    """The configured agent a `switchboard/<agentId>` model names, else a 404."""
    prefix, sep, agent = model.strip().partition("/")
    agent = agent.strip().lower()
    known = svc.config.agent_ids()
    if prefix.lower() == MODEL_PREFIX[:-1] and sep and agent in known:
        return agent
    available = ", ".join(model_id(a) for a in known)
    raise OpenAIError(
        404,
        f"The model `{model}` does not exist. Available models: {available}",
        code="model_not_found",
        param="model",
    )


def user_session_rest(user: str) -> str:
    """`openai-user:<user>`; a user id outside [a-z0-9_-.@+=]{1,128} is hashed instead."""
    value = user.strip()
    if _PLAIN_USER.fullmatch(value):
        return f"{USER_SEGMENT}:{value}"
    return f"{USER_SEGMENT}:u-{hashlib.sha256(value.encode()).hexdigest()[:32]}"


def header_session(svc: Services, agent_id: str, headers: Mapping[str, str]) -> str | None:
    """The canonical session key the session header names (a key of the model's agent),
    or None without the header."""
    for name in SESSION_HEADERS:
        raw = headers.get(name, "").strip()
        if not raw:
            continue
        key = resolve_session_ref(svc, raw, agent_id=agent_id)
        parsed = sk.parse_agent_key(key)
        if parsed is not None and parsed.agent_id != agent_id:
            raise InvalidInput(  # naming what was given, not the key a sessionId maps to
                f'session "{raw}" is not a session of the model\'s agent "{agent_id}"',
                field=name,
            )
        return key
    return None


def session_for(
    svc: Services,
    agent_id: str,
    headers: Mapping[str, str],
    user: str | None,
    default: str | None = None,
) -> str:
    """The canonical session key: the session header, else the user's session, else
    ``default`` (a session-scoped token's session), else main."""
    key = header_session(svc, agent_id, headers)
    if key is not None:
        return key
    if default is not None and not (user and user.strip()):
        return default
    if user and user.strip():
        return sk.canonical_key(user_session_rest(user), agent_id=agent_id, **key_options(svc))
    return sk.main_session_key(agent_id, **key_options(svc))


def _text_of(message: ChatMessage) -> str:
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.type not in ("text", "input_text"):
            raise InvalidInput(
                f"unsupported content part type {part.type!r}: only text is accepted",
                field="messages",
            )
        texts.append(part.text or "")
    return "\n".join(texts)


def tool_results(messages: list[ChatMessage]) -> list[tuple[str, str]]:
    """The trailing `tool` messages' (call id, content): the client's tool results (a
    trailing legacy `function` message is refused: its result names no call)."""
    if messages[-1].role == "function":
        raise InvalidInput(
            "function messages are not supported: answer tool calls with tool messages",
            field=f"messages[{len(messages) - 1}]",
        )
    out = []
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.role != "tool":
            break
        if not message.tool_call_id:
            raise InvalidInput("a tool message needs its tool_call_id", field=f"messages[{i}]")
        out.append((message.tool_call_id, _text_of(message)))
    return out[::-1]


def last_user_text(messages: list[ChatMessage]) -> str:
    """The text of the last user message (the one sent to the session)."""
    last = next((m for m in reversed(messages) if m.role == "user"), None)
    if last is None:
        raise InvalidInput("messages must contain a user message", field="messages")
    text = _text_of(last)
    if not text.strip():
        raise InvalidInput("the last user message is empty", field="messages")
    return text


def system_text(messages: list[ChatMessage]) -> str | None:
    """The request's system and developer messages, joined: extra instructions for this run."""
    texts = [_text_of(m) for m in messages if m.role in {"system", "developer"}]
    joined = "\n\n".join(t for t in texts if t.strip())
    return joined or None


async def await_run(request: Request, run_id: str, wait_s: float) -> RunRecord:
    """The run once it ended `ok`; a failed, timed-out or still running run is an error."""
    state = request.app.state
    rec: RunRecord | None = await state.waiter.wait(run_id, wait_s, state.fetch_run)
    if rec is None:
        raise OpenAIError(500, f"run {run_id} not found", "server_error", code="run_not_found")
    if rec.status == "ok":
        return rec
    if rec.status in ("error", "lost", "cancelled"):  # lost, cancelled: its error says so
        raise OpenAIError(
            502,
            f"the agent run failed: {rec.error or 'unknown error'}",
            "server_error",
            code="run_failed",
            headers=dict(_NO_RETRY),
        )
    if rec.status == "timeout":
        raise OpenAIError(
            504,
            f"the agent run timed out: {rec.error or 'deadline passed'}",
            "server_error",
            code="run_timeout",
            headers=dict(_NO_RETRY),
        )
    raise OpenAIError(
        504,
        f"no reply within {wait_s:g} s: run {run_id} is still {rec.status}; "
        "its outcome stays available through the `agent.wait` gateway method",
        "server_error",
        code="run_pending",
        headers=dict(_NO_RETRY),
    )


def chunk(
    turn: Turn,
    delta: ChoiceDelta | None = None,
    finish: Literal["stop", "tool_calls"] | None = None,
    usage: CompletionUsage | None = None,
) -> ServerSentEvent:
    """A `chat.completion.chunk` as one SSE event (no choices when it carries usage)."""
    choices = []
    if delta is not None:
        choices = [ChunkChoice(index=0, delta=delta, finish_reason=finish, logprobs=None)]
    body = ChatCompletionChunk(
        id=turn.completion_id,
        object="chat.completion.chunk",
        created=turn.created,
        model=turn.model,
        choices=choices,
    )
    if usage is not None:
        body.usage = usage
    return ServerSentEvent(data=body.model_dump_json(exclude_unset=True))


async def stream_events(
    request: Request, turn: Turn, reply: str | None, wait_s: float, include_usage: bool
) -> AsyncIterator[ServerSentEvent]:
    """Role chunk, then (once the run ends) content, finish and usage chunks, then [DONE].

    A run that fails after the stream opened is reported as a `data: {"error": …}` event.
    """
    yield chunk(turn, ChoiceDelta(role="assistant", content=""))
    usage, calls = None, []
    if reply is None and turn.run_id is not None:
        try:
            rec = await await_run(request, turn.run_id, wait_s)
        except Exception as exc:
            yield ServerSentEvent(data=json.dumps(as_openai_error(exc).body()))
            yield ServerSentEvent(data="[DONE]")
            return
        reply, usage, calls = rec.reply or "", usage_of(rec), rec.tool_calls
    if reply:
        yield chunk(turn, ChoiceDelta(content=reply))
    for delta in chat_tool_deltas(calls):
        yield chunk(turn, ChoiceDelta(tool_calls=[delta]))
    yield chunk(turn, ChoiceDelta(), finish="tool_calls" if calls else "stop")
    if include_usage:
        yield chunk(
            turn,
            usage=usage or CompletionUsage(prompt_tokens=0, completion_tokens=0, total_tokens=0),
        )
    yield ServerSentEvent(data="[DONE]")


@router.post(
    "/v1/chat/completions",
    dependencies=[Depends(require_token)],
    openapi_extra=json_body_schema(ChatCompletionRequest),
    response_model=None,
)
async def chat_completions(request: Request) -> Response:
    """Send the last user message to the agent's session and answer with the run's reply."""
    body = await parse_openai_body(request, ChatCompletionRequest)
    if body.n is not None and body.n != 1:
        raise OpenAIError(
            400,
            f"Invalid value for 'n': {body.n}; only 1 is supported (one reply per request)",
            code="invalid_value",
            param="n",
        )
    svc: Services = request.app.state.services
    agent_id = agent_for_model(svc, body.model)
    tools, choice = chat_tools(svc, body.tools, body.tool_choice)
    given = tool_results(body.messages)
    text = "" if given else last_user_text(body.messages)
    extra = system_text(body.messages)
    principal = principal_of(request)
    check_acting_agent(request, principal, agent_id)
    key = await run_in_threadpool(
        session_for, svc, agent_id, request.headers, body.user, principal.session_key
    )
    check_acting_session(request, principal, key)
    idempotency_key = request.headers.get("idempotency-key") or None
    results: list[dict[str, Any]] = []
    if given:  # the client's tool results continue the session's last run
        cont = await run_in_threadpool(continuation, svc, key, given, field="messages")
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
    turn = Turn(
        completion_id=f"chatcmpl-{run_id or uuid.uuid4()}",
        model=model_id(agent_id),
        created=int(time.time()),
        session_key=key,
        run_id=str(run_id) if run_id else None,
    )
    # Without a run id the message was an owner command (`/send on`), answered at once.
    immediate = None if run_id else str(started.get("reply", ""))
    wait_s = float(svc.config.runs.timeout_seconds) + WAIT_GRACE_S
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventSourceResponse(
            stream_events(request, turn, immediate, wait_s, include_usage),
            headers=turn.headers(),
            ping=PING_INTERVAL_S,
            sep="\n",
        )
    if immediate is not None:
        return JSONResponse(completion(turn, immediate, None), headers=turn.headers())
    try:
        rec = await await_run(request, str(run_id), wait_s)
    except OpenAIError as err:
        err.headers.update(turn.headers())
        raise
    answer = completion(turn, rec.reply or "", usage_of(rec), rec.tool_calls)
    return JSONResponse(answer, headers=turn.headers())


def check_acting_agent(request: Request, principal: Principal, agent_id: str) -> None:
    """Refuse a scoped token acting as another agent, or starting runs with a tool list."""
    note = audit_note(request)
    if note is not None:
        note.tool = model_id(agent_id)
    principal.check_agent(agent_id)
    principal.check_may_start_runs()


def check_acting_session(request: Request, principal: Principal, key: str) -> None:
    """Refuse a scoped token acting as a session outside its scope (noted for the audit)."""
    note = audit_note(request)
    if note is not None:
        note.session_key = key
    principal.check_session(key)


def _model_card(agent_id: str) -> dict[str, Any]:
    card = Model(id=model_id(agent_id), object="model", created=STARTED_AT, owned_by="switchboard")
    return card.model_dump(mode="json", exclude_none=True)


@router.get("/v1/models", dependencies=[Depends(require_token)], response_model=None)
async def list_models(request: Request) -> dict[str, Any]:
    """One model per configured agent: `switchboard/<agentId>`."""
    svc: Services = request.app.state.services
    principal = principal_of(request)
    agents = [a for a in svc.config.agent_ids() if principal.is_owner or a == principal.agent_id]
    return {"object": "list", "data": [_model_card(a) for a in agents]}


@router.get("/v1/models/{model:path}", dependencies=[Depends(require_token)], response_model=None)
async def get_model(model: str, request: Request) -> dict[str, Any]:
    """One agent's model card, or 404 `model_not_found`."""
    svc: Services = request.app.state.services
    return _model_card(agent_for_model(svc, model))
