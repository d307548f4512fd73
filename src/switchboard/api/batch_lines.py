"""Checking a batch's input file before anything runs, naming every bad line.

Each line must be a JSON object with a `custom_id` unique in the file, `method` POST,
`url` equal to the batch's endpoint and a `body` the endpoint itself would accept (the
request models and checks of `/v1/chat/completions` and `/v1/responses`), whose `model`
is `switchboard/<agentId>` of a configured agent the token may act as. A good line
becomes a `LinePlan`; a bad one an error `{code, line, message, param}`. Blank lines are
skipped. The file is read a page at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from pydantic import ValidationError

from switchboard.api.limits import MAX_JSON_DEPTH, json_too_deep
from switchboard.api.openai_compat import (
    ChatCompletionRequest,
    OpenAIError,
    agent_for_model,
    as_openai_error,
    body_error,
    last_user_text,
    session_for,
    system_text,
)
from switchboard.api.responses import ResponseCreateRequest, request_text
from switchboard.api.scopes import Principal
from switchboard.shared.batches.plans import CHAT, RESPONSES, LinePlan
from switchboard.shared.errors import SwitchboardError
from switchboard.shared.services import Services

# Errors listed at most (the batch fails on the first; the rest help fix the file).
MAX_ERRORS = 100


@dataclass
class Checked:
    """What the check of a file found: its errors (none: every line is planned)."""

    errors: list[dict[str, Any]] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    lines: int = 0

    def add(self, line: int, err: OpenAIError) -> None:
        """Note a bad line (up to `MAX_ERRORS`)."""
        if len(self.errors) < MAX_ERRORS:
            code = err.code or "invalid_request"
            self.errors.append(
                {"code": code, "line": line, "message": err.message, "param": err.param}
            )


def _bad(message: str, code: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, code=code, param=param)


def _prefixed(err: OpenAIError) -> OpenAIError:
    """An error of the line's body, its parameter named inside the line (`body.model`)."""
    if err.param and not err.param.startswith("body"):
        err.param = f"body.{err.param}"
    return err


def plan_line(
    svc: Services,
    principal: Principal,
    endpoint: str,
    raw: bytes,
    number: int,
    seen: set[str],
) -> LinePlan:
    """One line checked as the batch's endpoint would check its request, or an error."""
    if json_too_deep(raw):  # as a request body would be (`limits.JsonDepthLimit`)
        message = f"the line nests JSON arrays/objects deeper than {MAX_JSON_DEPTH} levels"
        raise _bad(message, "invalid_json_line")
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _bad("the line is not valid JSON", "invalid_json_line") from None
    if not isinstance(item, dict):
        raise _bad("the line must be a JSON object", "invalid_json_line")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id.strip() or len(custom_id) > 512:
        raise _bad("'custom_id' must be a non-empty string", "invalid_custom_id", "custom_id")
    if custom_id in seen:
        message = f"custom_id {custom_id!r} is used by an earlier line"
        raise _bad(message, "duplicate_custom_id", "custom_id")
    seen.add(custom_id)
    if item.get("method") != "POST":
        raise _bad("'method' must be POST", "invalid_method", "method")
    if item.get("url") != endpoint:
        raise _bad(f"'url' must be the batch's endpoint {endpoint}", "mismatched_endpoint", "url")
    body = item.get("body")
    if not isinstance(body, dict):
        raise _bad("'body' must be a JSON object", "invalid_body", "body")
    try:
        return _plan_body(svc, principal, endpoint, body, custom_id, number)
    except ValidationError as exc:
        raise _prefixed(body_error(exc)) from None
    except OpenAIError as err:
        raise _prefixed(err) from None
    except SwitchboardError as exc:  # InvalidInput, ScopeRefused… in OpenAI's terms
        raise _prefixed(as_openai_error(exc)) from None


def _chat_plan(
    svc: Services, body: dict[str, Any], custom_id: str, number: int
) -> tuple[LinePlan, str | None]:
    """A `/v1/chat/completions` body as that endpoint checks it; its plan and `user`."""
    chat = ChatCompletionRequest.model_validate(body)
    if chat.n is not None and chat.n != 1:
        raise _bad("only n=1 is supported", "invalid_value", "n")
    if chat.tools:
        raise _bad("client-side 'tools' are not supported in a batch", "invalid_value", "tools")
    agent_id = agent_for_model(svc, chat.model)
    text, extra = last_user_text(chat.messages), system_text(chat.messages)
    return LinePlan(custom_id, agent_id, CHAT, text, number, extra), chat.user


def _responses_plan(
    svc: Services, body: dict[str, Any], custom_id: str, number: int
) -> tuple[LinePlan, str | None]:
    """A `/v1/responses` body as that endpoint checks it; its plan and `user`."""
    resp = ResponseCreateRequest.model_validate(body)
    if resp.previous_response_id is not None:
        message = "'previous_response_id' is not supported in a batch"
        raise _bad(message, "invalid_value", "previous_response_id")
    if resp.tools:
        raise _bad("client-side 'tools' are not supported in a batch", "invalid_value", "tools")
    agent_id = agent_for_model(svc, resp.model)
    text, extra, results = request_text(resp)
    if results:
        message = "'function_call_output' input items are not supported in a batch"
        raise _bad(message, "invalid_value", "input")
    user = body.get("user")
    plan = LinePlan(
        custom_id,
        agent_id,
        RESPONSES,
        text,
        number,
        extra,
        instructions=resp.instructions,
        metadata=dict(resp.metadata or {}),
    )
    return plan, user if isinstance(user, str) else None


def _plan_body(
    svc: Services,
    principal: Principal,
    endpoint: str,
    body: dict[str, Any],
    custom_id: str,
    number: int,
) -> LinePlan:
    """The line's plan, its agent and session in the token's scope: the session its
    `user` names (or the token's), else None (a session of its own)."""
    if body.get("stream"):
        raise _bad("'stream' is not supported in a batch", "invalid_value", "stream")
    make = _chat_plan if endpoint == CHAT else _responses_plan
    plan, named = make(svc, body, custom_id, number)
    principal.check_agent(plan.agent_id)
    principal.check_may_start_runs()
    user = (named or "").strip() or None
    session = None
    if user or principal.session_key:
        session = session_for(svc, plan.agent_id, {}, user, principal.session_key)
        principal.check_session(session)
    return replace(plan, session_key=session)


def check_file(
    svc: Services, principal: Principal, endpoint: str, file_id: str, checked: Checked
) -> Iterator[str]:
    """The plans (JSON) of the file's lines, a page at a time; every bad line goes to
    ``checked.errors`` instead (the caller drops the plans when there is one)."""
    number = 0
    for page in svc.store.files.read(file_id):
        for raw in page:
            number += 1
            if not raw.strip():
                continue
            try:
                plan = plan_line(svc, principal, endpoint, raw, number, checked.seen)
            except OpenAIError as err:
                checked.add(number, err)
                continue
            checked.lines += 1
            if not checked.errors:
                yield plan.dumps()
