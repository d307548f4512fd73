"""OpenAI's Batches API: `POST/GET /v1/batches`, `GET /v1/batches/{id}`, `…/{id}/cancel`.

Creating a batch checks its input file line by line before anything runs
(`batch_lines`): any bad line fails the whole batch (`status: failed`, `errors.data`
naming each line) and nothing runs. Otherwise the batch is `in_progress` and a worker
admits its first lines (`shared.batches.lines`): each line a run of its agent, at most
`batches.maxConcurrent` at once (a batch's `metadata.maxConcurrent` may lower it).
A token sees and cancels only its own batches. Errors answer in OpenAI's shape.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from openai.types import Batch, BatchError, BatchRequestCounts
from openai.types.batch import Errors
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.concurrency import run_in_threadpool

from switchboard.api.auth import require_token
from switchboard.api.batch_lines import Checked, check_file
from switchboard.api.body import json_body_schema
from switchboard.api.files import find_file, list_page, note_call, owner_of
from switchboard.api.openai_compat import OpenAIError, OpenAIRoute, parse_openai_body
from switchboard.api.scopes import Principal, principal_of
from switchboard.shared.batches import lines
from switchboard.shared.batches.plans import ENDPOINTS, WINDOW_S
from switchboard.shared.services import Services
from switchboard.shared.store.batches import BatchRecord
from switchboard.shared.store.files import FileRecord

BATCH_PREFIX = "batch_"
# The batch's `*_at` fields and the store's names for them.
_TIMES = {
    "in_progress_at": "inProgressAt",
    "finalizing_at": "finalizingAt",
    "completed_at": "completedAt",
    "failed_at": "failedAt",
    "cancelling_at": "cancellingAt",
    "cancelled_at": "cancelledAt",
    "expired_at": "expiredAt",
}

router = APIRouter(route_class=OpenAIRoute)


class BatchCreateRequest(BaseModel):
    """`POST /v1/batches`."""

    model_config = ConfigDict(extra="ignore")

    input_file_id: StrictStr = Field(max_length=256)
    endpoint: StrictStr = Field(max_length=256)
    completion_window: StrictStr = Field(max_length=16)
    metadata: dict[StrictStr, StrictStr] | None = Field(default=None, max_length=16)


def batch_object(rec: BatchRecord) -> dict[str, Any]:
    """The `batch` object."""
    errors = None
    if rec.errors:
        errors = Errors(object="list", data=[BatchError(**e) for e in rec.errors])
    obj = Batch(
        id=rec.batch_id,
        object="batch",
        endpoint=rec.endpoint,
        input_file_id=rec.input_file_id,
        completion_window=rec.completion_window,
        status=rec.status,
        created_at=rec.created_at,
        expires_at=rec.created_at + WINDOW_S,
        errors=errors,
        output_file_id=rec.output_file_id,
        error_file_id=rec.error_file_id,
        metadata=dict(rec.metadata) or None,
        request_counts=BatchRequestCounts(
            total=rec.total, completed=rec.completed, failed=rec.failed
        ),
        **{name: rec.times.get(field) for name, field in _TIMES.items()},
    )
    return obj.model_dump(mode="json")


def _cap(svc: Services, metadata: dict[str, str]) -> int:
    """The batch's cap: `batches.maxConcurrent`, or lower as its metadata asks."""
    cap = svc.config.batches.max_concurrent
    asked = metadata.get("maxConcurrent", "").strip()
    if not asked:
        return cap
    if not asked.isdigit() or int(asked) < 1:
        raise OpenAIError(
            400,
            f"metadata.maxConcurrent must be a positive whole number, not {asked!r}",
            code="invalid_value",
            param="metadata.maxConcurrent",
        )
    return min(cap, int(asked))


def _check_request(body: BatchCreateRequest) -> None:
    """The endpoint and the window are ones this server runs, else a 400."""
    if body.endpoint not in ENDPOINTS:
        raise OpenAIError(
            400,
            f"Invalid value for 'endpoint': {body.endpoint!r}; supported: {', '.join(ENDPOINTS)}",
            code="invalid_value",
            param="endpoint",
        )
    if body.completion_window != "24h":
        raise OpenAIError(
            400,
            f"Invalid value for 'completion_window': {body.completion_window!r}; only '24h'",
            code="invalid_value",
            param="completion_window",
        )


def _input_file(svc: Services, principal: Principal, file_id: str) -> FileRecord:
    """The batch's input file: this token's, uploaded for a batch."""
    source = find_file(svc, principal, file_id)
    if source.purpose != "batch":
        raise OpenAIError(
            400,
            f"File {source.file_id} has purpose {source.purpose!r}, not 'batch'",
            code="invalid_value",
            param="input_file_id",
        )
    return source


def create(svc: Services, principal: Principal, body: BatchCreateRequest) -> BatchRecord:
    """Check the input file and record the batch: `in_progress`, or `failed` with the
    bad lines named (its plans dropped: nothing runs)."""
    _check_request(body)
    metadata = body.metadata or {}
    cap = _cap(svc, metadata)
    source = _input_file(svc, principal, body.input_file_id)
    batch_id = BATCH_PREFIX + secrets.token_hex(12)
    checked = Checked()
    plans = check_file(svc, principal, body.endpoint, source.file_id, checked)
    svc.store.batches.add_plans(batch_id, plans)
    if not checked.errors and checked.lines == 0:
        checked.add(0, OpenAIError(400, "the input file has no requests", code="empty_file"))
    failed = bool(checked.errors)
    if failed:
        svc.store.batches.drop_plans(batch_id)
    now = int(time.time())
    rec = BatchRecord(
        batch_id=batch_id,
        endpoint=body.endpoint,
        input_file_id=source.file_id,
        completion_window=body.completion_window,
        status="failed" if failed else "in_progress",
        created_at=now,
        owner=owner_of(principal),
        total=0 if failed else checked.lines,
        cap=cap,
        metadata=metadata,
        errors=checked.errors or None,
        times={"createdAt": now, ("failedAt" if failed else "inProgressAt"): now},
    )
    svc.store.batches.create(rec)
    if not failed:
        svc.queue.enqueue(lines.ADVANCE, batch_id)
    return rec


def find_batch(svc: Services, principal: Principal, batch_id: str) -> BatchRecord:
    """The batch, if it exists and is this token's; else a 404."""
    rec = svc.store.batches.get(batch_id) if batch_id.startswith(BATCH_PREFIX) else None
    if rec is None or rec.owner != owner_of(principal):
        raise OpenAIError(
            404, f"No batch found with id '{batch_id}'.", code="not_found", param="batch_id"
        )
    return rec


@router.post(
    "/v1/batches",
    dependencies=[Depends(require_token)],
    openapi_extra=json_body_schema(BatchCreateRequest),
    response_model=None,
)
async def create_batch(request: Request) -> Response:
    """Create a batch from an uploaded file: checked line by line, then run."""
    note_call(request, "batches.create")
    body = await parse_openai_body(request, BatchCreateRequest)
    svc: Services = request.app.state.services
    rec = await run_in_threadpool(create, svc, principal_of(request), body)
    note_call(request, "batches.create", rec.batch_id)
    return JSONResponse(batch_object(rec))


@router.get("/v1/batches", dependencies=[Depends(require_token)], response_model=None)
async def list_batches(
    request: Request,
    after: str | None = None,
    limit: int = Query(default=20, ge=1, le=100),
) -> Response:
    """This token's batches, newest first, paged with ``after``."""
    note_call(request, "batches.list")
    svc: Services = request.app.state.services
    owner = owner_of(principal_of(request))

    def read() -> tuple[list[BatchRecord], bool]:
        ids = svc.store.batches.page(owner, after=after, limit=limit + 1)
        found = svc.store.batches.get_many(ids[:limit])
        return [r for r in found if r is not None], len(ids) > limit

    recs, more = await run_in_threadpool(read)
    return list_page([batch_object(r) for r in recs], more)


@router.get("/v1/batches/{batch_id}", dependencies=[Depends(require_token)], response_model=None)
async def retrieve_batch(batch_id: str, request: Request) -> Response:
    """One batch as it stands (its counts live)."""
    note_call(request, "batches.retrieve", batch_id)
    svc: Services = request.app.state.services
    rec = await run_in_threadpool(find_batch, svc, principal_of(request), batch_id)
    return JSONResponse(batch_object(rec))


@router.post(
    "/v1/batches/{batch_id}/cancel", dependencies=[Depends(require_token)], response_model=None
)
async def cancel_batch(batch_id: str, request: Request) -> Response:
    """Stop admitting the batch's lines and cancel its runs in flight (`cancelling`, then
    `cancelled` once they ended); an ended batch is a 409."""
    note_call(request, "batches.cancel", batch_id)
    svc: Services = request.app.state.services
    principal = principal_of(request)

    def cancel() -> BatchRecord:
        rec = find_batch(svc, principal, batch_id)
        if rec.status in ("completed", "failed", "expired"):
            raise OpenAIError(
                409,
                f"Cannot cancel a batch with status '{rec.status}'.",
                code="invalid_state",
                param="batch_id",
            )
        lines.cancel(svc, batch_id)
        return find_batch(svc, principal, batch_id)

    rec = await run_in_threadpool(cancel)
    return JSONResponse(batch_object(rec))
