"""`GET /events`: the events stream as Server-Sent Events, resumable by stream id.

Each event is ``event: <type>``, ``data: <JSON>`` and ``id: <Redis stream id>`` (with the
slot group after it, ``<ms>-<seq>-<group>``, when the events are in a stream per group:
`switchboard.shared.store.event_follower`) (types in
``switchboard.shared.store.events``). A client that reconnects with ``Last-Event-ID`` (the
browser's ``EventSource`` does it by itself) gets every event after that id that the
capped stream still holds; without it the stream starts at the current end. The first
event is ``ready`` (``{lastEventId}``); an idle stream carries a ``: heartbeat`` comment
every ``HEARTBEAT_S``. ``?sessionKey=`` keeps only the events of one session.

Auth: the bearer token as everywhere, or, because ``EventSource`` cannot set headers,
``?token=<token>`` or the cookie the console's login sets (``EVENTS_COOKIE``: a
console session, never the token itself; HttpOnly, sent to ``/events`` only).
``EventsCredentials`` turns either into an ``Authorization`` header before any auth check
runs, so the same check (and lockout) applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from switchboard.api.auth import require_token
from switchboard.shared.errors import InvalidInput, StoreUnavailable
from switchboard.shared.gateway.resolve import resolve_session_ref
from switchboard.shared.services import Services
from switchboard.shared.store import codec
from switchboard.shared.store.aio import AsyncStore

log = logging.getLogger("switchboard.api")

EVENTS_PATH = "/events"
# The cookie the console's login sets; only ever sent to EVENTS_PATH.
EVENTS_COOKIE = "switchboard_events"
# Seconds between heartbeat comments on an idle stream.
HEARTBEAT_S = 10.0
# How long a browser waits before reconnecting (the SSE `retry` field), in ms.
RETRY_MS = 2000
# How long one read of the stream blocks waiting for a new event.
_READ_BLOCK_MS = 5000
# How much longer than a blocking read the socket waits before calling Redis lost.
_READ_MARGIN_S = 15.0
# Events read per round trip.
_BATCH = 200
# A stream id; with the events in one stream per slot group, followed by the group.
_STREAM_ID = re.compile(r"^\d{1,20}(-\d{1,20})?$")
_GROUPED_ID = re.compile(r"^\d{1,20}-\d{1,20}-\d{1,5}$")


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """One async store for every open stream (a blocking read holds a connection)."""
    svc: Services = app.state.services
    store = AsyncStore.from_url(
        svc.settings.redis_url or "",
        svc.store.ks,
        socket_keepalive=True,
        health_check_interval=25,
        socket_timeout=_READ_BLOCK_MS / 1000 + _READ_MARGIN_S,
    )
    app.state.events_store = store
    try:
        yield
    finally:
        await store.aclose()


router = APIRouter(lifespan=_lifespan)


@dataclass(frozen=True)
class StreamRequest:
    """Where a stream starts and which session it follows."""

    after_id: str | None
    session_key: str | None


async def stream_request(
    request: Request,
    sessionKey: Annotated[str | None, Query(max_length=512)] = None,
    lastEventId: Annotated[str | None, Query(max_length=64)] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=64)] = None,
) -> StreamRequest:
    """Validate the resume point and resolve the session filter before streaming starts."""
    after = (last_event_id or lastEventId or "").strip() or None
    svc: Services = request.app.state.services
    groups = svc.store.ks.groups
    if after is not None and not _valid_id(after, groups):
        example = "0-0" if groups == 1 else "0-0-0"
        raise InvalidInput(
            f"invalid Last-Event-ID {after!r}: use an event id from this stream, e.g. {example}",
            field="lastEventId",
        )
    key = None
    if sessionKey is not None and sessionKey.strip():
        key = await run_in_threadpool(resolve_session_ref, svc, sessionKey)
    return StreamRequest(after_id=after, session_key=key)


def _valid_id(event_id: str, groups: int) -> bool:
    """Whether ``event_id`` is an id this stream gives: a stream id, or with several slot
    groups a stream id and one of the groups."""
    if _STREAM_ID.match(event_id) is not None:
        return True  # with several groups: as the same id in group 0 (`0-0`: the start)
    return (
        groups > 1
        and _GROUPED_ID.match(event_id) is not None
        and int(event_id.rsplit("-", 1)[1]) < groups
    )


@router.get(
    EVENTS_PATH,
    dependencies=[Depends(require_token)],
    summary="Server-Sent Events: runs, deliveries (resumable with Last-Event-ID)",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "The event stream"}},
)
async def events(
    request: Request, req: Annotated[StreamRequest, Depends(stream_request)]
) -> EventSourceResponse:
    """Follow the events stream (see the module docstring for the wire format)."""
    # sse-starlette ends open streams when the server shuts down (a plain streaming
    # response would keep uvicorn waiting for them) and sends the heartbeats itself.
    return EventSourceResponse(
        _follow(request, req),
        ping=HEARTBEAT_S,
        ping_message_factory=lambda: ServerSentEvent(comment="heartbeat"),
        sep="\n",
    )


async def _follow(request: Request, req: StreamRequest) -> AsyncIterator[ServerSentEvent]:
    """``ready``, then every event after the cursor, as it is appended."""
    store: AsyncStore = request.app.state.events_store
    follower = await store.follow_events(req.after_id)
    ready = codec.dumps({"lastEventId": follower.cursor})
    yield ServerSentEvent(ready, event="ready", id=follower.cursor, retry=RETRY_MS)
    while True:
        try:
            batch = await follower.next(count=_BATCH, block_ms=_READ_BLOCK_MS)
        except StoreUnavailable as exc:
            log.warning("events stream read failed (%s); retrying", exc.__cause__)
            await asyncio.sleep(1.0)
            continue
        for event_id, event_type, data in batch:
            if req.session_key is None or data.get("sessionKey") == req.session_key:
                yield ServerSentEvent(codec.dumps(data), event=event_type, id=event_id)


class EventsCredentials:
    """ASGI middleware: on ``EVENTS_PATH`` only, a ``?token=`` or the events cookie becomes
    ``Authorization: Bearer …`` when the request has no Authorization header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == EVENTS_PATH:
            headers = list(scope.get("headers", ()))
            if not any(name == b"authorization" for name, _ in headers):
                token = _query_token(scope) or _cookie_token(headers)
                if token:
                    headers.append(
                        (b"authorization", b"Bearer " + token.encode("latin-1", "replace"))
                    )
                    scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


def _query_token(scope: Scope) -> str | None:
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    for name, value in parse_qsl(query):
        if name == "token" and value:
            return value
    return None


def _cookie_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name != b"cookie":
            continue
        jar: SimpleCookie = SimpleCookie()
        with contextlib.suppress(Exception):
            jar.load(value.decode("latin-1"))
        morsel = jar.get(EVENTS_COOKIE)
        if morsel is not None and morsel.value:
            return morsel.value
    return None
