"""A batch line as validated (`LinePlan`, what a worker starts a run from) and the line a
finished run writes to the batch's output or error file.

An output line is ``{id, custom_id, response: {status_code, request_id, body}, error}``,
its body exactly what `/v1/chat/completions` or `/v1/responses` answers for the request
(`gateway.openai_bodies`); a line whose run did not end `ok` goes to the error file with
the status and error the surface would have answered.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from switchboard.shared.gateway.openai_bodies import (
    RESPONSE_PREFIX,
    Turn,
    as_json,
    completion,
    failure_text,
    model_id,
    response_object,
    usage_of,
)
from switchboard.shared.store import codec
from switchboard.shared.store.responses import ResponseRecord
from switchboard.shared.store.runs import RunRecord

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
ENDPOINTS = (CHAT, RESPONSES)
# The one completion window (`24h`): lines not answered within it end `batch_expired`.
WINDOW_S = 24 * 3600
EXPIRED = "This request could not be executed before the completion window expired."

Endpoint = Literal["/v1/chat/completions", "/v1/responses"]


@dataclass(frozen=True)
class LinePlan:
    """One line of a batch, checked: what its run is started with."""

    custom_id: str
    agent_id: str
    endpoint: str
    text: str
    line: int  # 1-based, in the input file
    extra: str | None = None  # the run's extra instructions
    session_key: str | None = None  # a session the request names (`user`), else its own
    instructions: str | None = None  # a Responses request's `instructions`
    metadata: dict[str, str] = field(default_factory=dict)

    def dumps(self) -> str:
        """As stored (JSON)."""
        return codec.dumps({k: v for k, v in asdict(self).items() if v not in (None, {})})

    @classmethod
    def loads(cls, text: str) -> LinePlan:
        """From its stored JSON."""
        return cls(**codec.loads(text))


def line_id(batch_id: str, index: int) -> str:
    """The id of a batch's output line (`batch_req_…`)."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{index}"


def answer_body(plan: LinePlan, run: RunRecord) -> dict[str, Any]:
    """What the plan's endpoint answers for a run that ended `ok`."""
    created_ms = run.created_at_ms or int(time.time() * 1000)
    if plan.endpoint == CHAT:
        turn = Turn(
            completion_id=f"chatcmpl-{run.run_id}",
            model=model_id(plan.agent_id),
            created=created_ms // 1000,
            session_key=run.session_key,
            run_id=run.run_id,
        )
        return completion(turn, run.reply or "", usage_of(run))
    rec = ResponseRecord(
        response_id=f"{RESPONSE_PREFIX}{run.run_id}",
        session_key=run.session_key,
        agent_id=plan.agent_id,
        created_at_ms=created_ms,
        run_id=run.run_id,
        instructions=plan.instructions,
        metadata=plan.metadata,
    )
    return as_json(response_object(rec, run))


def _error(status: int, code: str, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def failed_answer(run: RunRecord) -> tuple[int, str, str]:
    """(HTTP status, code, message) the surface answers for a run that did not end `ok`."""
    if run.status == "timeout":
        return 504, "run_timeout", failure_text(run)
    if run.status == "cancelled":
        return 499, "batch_cancelled", f"the line's run was cancelled: {run.error or 'cancel'}"
    return 502, "run_failed", failure_text(run)


def output_line(
    batch_id: str, index: int, plan: LinePlan, run: RunRecord, *, expired: bool = False
) -> tuple[bool, str]:
    """(ok, the line to write) for a line whose run ended (``expired``: a run cancelled
    because the batch's window passed)."""
    if expired and run.status == "cancelled":
        error = {"code": "batch_expired", "message": EXPIRED}
        return False, _line(batch_id, index, plan, None, error)
    if run.status == "ok":
        response = {"status_code": 200, "request_id": run.run_id, "body": answer_body(plan, run)}
        return True, _line(batch_id, index, plan, response, None)
    status, code, message = failed_answer(run)
    body = _error(status, code, message, "server_error")
    response = {"status_code": status, "request_id": run.run_id, "body": body}
    return False, _line(batch_id, index, plan, response, {"code": code, "message": message})


def expired_line(batch_id: str, index: int, plan: LinePlan) -> str:
    """The error line of a line its batch's window passed before it ran."""
    return _line(batch_id, index, plan, None, {"code": "batch_expired", "message": EXPIRED})


def refused_line(
    batch_id: str, index: int, plan: LinePlan, status: int, code: str, message: str
) -> str:
    """The error line of a line whose run could not start (refused by policy or scope)."""
    body = _error(status, code, message, "invalid_request_error")
    response = {"status_code": status, "request_id": None, "body": body}
    return _line(batch_id, index, plan, response, {"code": code, "message": message})


def _line(
    batch_id: str,
    index: int,
    plan: LinePlan,
    response: dict[str, Any] | None,
    error: dict[str, Any] | None,
) -> str:
    return codec.dumps(
        {
            "id": line_id(batch_id, index),
            "custom_id": plan.custom_id,
            "response": response,
            "error": error,
        }
    )
