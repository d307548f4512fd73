"""OpenAI's Files API: `POST/GET /v1/files`, `GET/DELETE /v1/files/{id}`, `…/{id}/content`.

Uploads (`purpose: "batch"`, JSONL) are read as they arrive and written to the store a
page of lines at a time (`uploads`), within `batches.maxFileBytes` and `batches.maxLines`;
a batch's output and error files are made the same way by the batch itself. A token sees
only the files it made (the owner token, its own). Errors answer in OpenAI's shape.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from openai.types import FileDeleted, FileObject
from starlette.concurrency import run_in_threadpool

from switchboard.api.auth import require_token
from switchboard.api.openai_compat import OpenAIError, OpenAIRoute
from switchboard.api.scopes import Principal, audit_note, principal_of
from switchboard.api.uploads import LineUpload, read_upload
from switchboard.shared.services import Services
from switchboard.shared.store.files import FileRecord

FILE_PREFIX = "file-"
PURPOSES = ("batch",)
OWNER = "owner"  # who the owner token's files belong to

router = APIRouter(route_class=OpenAIRoute)


def owner_of(principal: Principal) -> str:
    """Whose files and batches a request sees: its scoped token's, or the owner's."""
    return principal.token_id or OWNER


def note_call(request: Request, call: str, target: str | None = None) -> None:
    """Name the call (and the file or batch it concerns) for the audit of a scoped token."""
    note = audit_note(request)
    if note is not None:
        note.tool = f"{call} {target}" if target else call


def file_object(rec: FileRecord) -> dict[str, Any]:
    """The `file` object."""
    obj = FileObject(
        id=rec.file_id,
        object="file",
        bytes=rec.bytes,
        created_at=rec.created_at,
        filename=rec.filename,
        purpose=rec.purpose,
        status="processed",
        expires_at=rec.expires_at,
    )
    return obj.model_dump(mode="json")


def not_found(file_id: str) -> OpenAIError:
    """The 404 for a file this token does not see."""
    return OpenAIError(404, f"No such File object: {file_id}", code="not_found", param="id")


def find_file(svc: Services, principal: Principal, file_id: str) -> FileRecord:
    """The file, if it exists and is this token's; else a 404."""
    rec = svc.store.files.get(file_id) if file_id.startswith(FILE_PREFIX) else None
    if rec is None or rec.owner != owner_of(principal):
        raise not_found(file_id)
    return rec


def _form_problem(upload: LineUpload, purpose: str) -> OpenAIError | None:
    """What is wrong with an upload's form (no file part, a purpose not served), if any."""
    if upload.filename is None:
        return OpenAIError(400, "Missing required parameter: 'file'.", param="file")
    if purpose not in PURPOSES:
        return OpenAIError(
            400,
            f"Invalid value for 'purpose': {purpose!r}; this server accepts 'batch'",
            code="invalid_value",
            param="purpose",
        )
    return None


@router.post("/v1/files", dependencies=[Depends(require_token)], response_model=None)
async def create_file(request: Request) -> Response:
    """Upload a JSONL file (`purpose: batch`), read and stored as it arrives."""
    note_call(request, "files.create")
    svc: Services = request.app.state.services
    limits = svc.config.batches
    declared = request.headers.get("content-length", "")
    # The form's own bytes (boundaries, headers) come on top of the file's.
    if declared.isdigit() and int(declared) > limits.max_file_bytes + 64 * 1024:
        raise OpenAIError(
            400,
            f"File is too large: it is over the limit of {limits.max_file_bytes} bytes "
            "(batches.maxFileBytes)",
            code="file_too_large",
            param="file",
        )
    file_id = FILE_PREFIX + secrets.token_hex(12)
    upload = LineUpload(svc.store.files.begin(file_id), limits.max_file_bytes, limits.max_lines)
    await read_upload(request, upload)
    purpose = upload.fields.get("purpose", "").strip()
    problem = _form_problem(upload, purpose)
    if problem is not None:
        await run_in_threadpool(upload.upload.abandon)
        raise problem
    now = int(time.time())
    rec = FileRecord(
        file_id=file_id,
        filename=upload.filename or "upload.jsonl",
        purpose=purpose,
        bytes=upload.size,
        lines=upload.lines,
        created_at=now,
        owner=owner_of(principal_of(request)),
        expires_at=now + svc.store.files.ttl_s,
    )
    await run_in_threadpool(svc.store.files.commit, rec)
    return JSONResponse(file_object(rec))


@router.get("/v1/files", dependencies=[Depends(require_token)], response_model=None)
async def list_files(
    request: Request,
    after: str | None = None,
    limit: int = Query(default=10_000, ge=1, le=10_000),
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> Response:
    """This token's files, newest first (``order=asc``: oldest), paged with ``after``."""
    note_call(request, "files.list")
    svc: Services = request.app.state.services
    owner = owner_of(principal_of(request))

    def read() -> tuple[list[FileRecord], bool]:
        ids = svc.store.files.page(
            owner, after=after, limit=limit + 1, newest_first=order == "desc"
        )
        found = svc.store.files.get_many(ids[:limit])
        recs = [r for r in found if r is not None and (purpose is None or r.purpose == purpose)]
        return recs, len(ids) > limit

    recs, more = await run_in_threadpool(read)
    return list_page([file_object(r) for r in recs], more)


def list_page(data: list[dict[str, Any]], more: bool) -> JSONResponse:
    """One page of an OpenAI list (files, batches): its items, first and last ids, more."""
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": more,
        }
    )


@router.get("/v1/files/{file_id}", dependencies=[Depends(require_token)], response_model=None)
async def retrieve_file(file_id: str, request: Request) -> Response:
    """One file's object."""
    note_call(request, "files.retrieve", file_id)
    svc: Services = request.app.state.services
    rec = await run_in_threadpool(find_file, svc, principal_of(request), file_id)
    return JSONResponse(file_object(rec))


@router.delete("/v1/files/{file_id}", dependencies=[Depends(require_token)], response_model=None)
async def delete_file(file_id: str, request: Request) -> Response:
    """Delete a file and its lines."""
    note_call(request, "files.delete", file_id)
    svc: Services = request.app.state.services
    rec = await run_in_threadpool(find_file, svc, principal_of(request), file_id)
    await run_in_threadpool(svc.store.files.delete, rec)
    return JSONResponse(FileDeleted(id=file_id, object="file", deleted=True).model_dump())


@router.get(
    "/v1/files/{file_id}/content", dependencies=[Depends(require_token)], response_model=None
)
async def file_content(file_id: str, request: Request) -> Response:
    """The file's bytes, sent a page of lines at a time."""
    note_call(request, "files.content", file_id)
    svc: Services = request.app.state.services
    rec = await run_in_threadpool(find_file, svc, principal_of(request), file_id)

    def body() -> Iterator[bytes]:
        for page in svc.store.files.read(rec.file_id):
            yield b"".join(line + b"\n" for line in page)

    return StreamingResponse(
        body(),
        media_type="application/octet-stream",
        headers={"content-disposition": f'attachment; filename="{rec.filename}"'},
    )
