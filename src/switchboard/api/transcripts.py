"""`GET /sessions/{key}/transcript.jsonl`: a session's whole transcript, one JSON message a line.

This is what `transcriptPath` in session rows and spawn announces points at (built by
``keys.transcript_url``), so a user can open it with the api's token: messages in their
stored form (the form an archive export writes), oldest first, streamed a page at a time
so a long transcript is never held whole in the api.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from switchboard.api.auth import require_token
from switchboard.shared.errors import NotFound
from switchboard.shared.gateway.resolve import resolve_session_ref
from switchboard.shared.services import Services

router = APIRouter()

JSONL_MEDIA_TYPE = "application/x-ndjson"


@router.get("/sessions/{key:path}/transcript.jsonl", dependencies=[Depends(require_token)])
async def transcript_jsonl(request: Request, key: str) -> StreamingResponse:
    """Stream the transcript of session ``key`` (a key or sessionId); 404 if there is none."""
    svc: Services = request.app.state.services
    pages = await run_in_threadpool(_open_pages, svc, key)
    return StreamingResponse(_lines(pages), media_type=JSONL_MEDIA_TYPE)


def _open_pages(svc: Services, ref: str) -> Iterator[list[dict[str, Any]]]:
    """The transcript's pages with the first already read, so a missing session or a
    down Redis is answered with a status before any line is sent."""
    key = resolve_session_ref(svc, ref)
    if not svc.store.sessions.exists(key):
        raise NotFound(f"session not found: {ref}", key=ref)
    pages = svc.store.transcripts.pages(key)
    return itertools.chain([next(pages, [])], pages)


def _lines(pages: Iterator[list[dict[str, Any]]]) -> Iterator[bytes]:
    """One JSON line per message; the read-side ``__openclaw`` sequence mark is dropped."""
    for page in pages:
        chunk = bytearray()
        for message in page:
            message.pop("__openclaw", None)
            chunk += orjson.dumps(message) + b"\n"
        if chunk:
            yield bytes(chunk)
