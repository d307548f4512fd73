"""ASGI middleware that refuses bodies before any parser sees them: 413 over the size
limit (`BodySizeLimit`), 400 when JSON nests deeper than `MAX_JSON_DEPTH` (`JsonDepthLimit`).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from switchboard.api.errors import error_response, openai_error_response
from switchboard.shared.errors import InvalidInput

MAX_BODY_BYTES = 2 * 1024 * 1024
# Paths whose bodies are read as they arrive, under limits of their own (file uploads,
# `batches.maxFileBytes`): not limited here, nor read whole for their depth.
STREAMED_PATHS = frozenset({"/v1/files"})
# Arrays and objects inside each other a request body may hold (deeper: 400, before any
# parser or schema validator recurses into it).
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    """Rejects bodies larger than ``max_bytes`` (by Content-Length or while streaming),
    but on the ``streamed`` paths."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = MAX_BODY_BYTES,
        streamed: frozenset[str] = STREAMED_PATHS,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.streamed:
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    await _reject(send)
                    return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return msg

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _reject(send)


async def _reject(send: Send) -> None:
    body: dict[str, Any] = {
        "ok": False,
        "error": {"type": "payload_too_large", "message": "request body over 2 MB"},
    }
    data = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def json_too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests arrays and objects deeper than ``limit`` levels.

    No recursion and no parse: strings are cut out and only the brackets kept, then each
    pass removes every innermost pair, so a body is too deep when ``limit`` passes leave
    brackets. Each pass is one C-level ``replace`` (a 2 MB body of brackets: at most ~1 s,
    and only behind the token); a body with few brackets is not looked at past counting
    them. Unbalanced brackets are the parser's to report."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKET)
    brackets = brackets.replace(b"{", b"[").replace(b"}", b"]")
    if b"[" * (limit + 1) in brackets:  # one long run of openings: no passes needed
        return True
    for _ in range(limit):
        inner_removed = brackets.replace(b"[]", b"")
        if not inner_removed or len(inner_removed) == len(brackets):
            return False
        brackets = inner_removed
    return True


class JsonDepthLimit:
    """Reads a request's body whole (within `BodySizeLimit`) and answers 400 when it nests
    deeper than ``max_depth``; the app then reads the same body. File uploads
    (`STREAMED_PATHS`) pass as they stream: their lines are checked as they are parsed."""

    def __init__(self, app: ASGIApp, max_depth: int = MAX_JSON_DEPTH) -> None:
        self.app = app
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] in _NO_BODY_METHODS
            or scope.get("path") in STREAMED_PATHS  # uploads: read as they arrive
        ):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        ending: Message | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":
                ending = message  # the client left: the app hears it as it reads
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        if json_too_deep(body, self.max_depth):
            await _too_deep(scope, receive, send, self.max_depth)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": ending is not None}
            return ending if ending is not None else await receive()

        await self.app(scope, replay, send)


async def _too_deep(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    message = f"request body nests JSON arrays/objects deeper than {limit} levels"
    if scope["path"].startswith("/v1/"):  # OpenAI clients read OpenAI's shape
        response = openai_error_response(400, message, code="json_too_deep")
    else:
        response = error_response(400, InvalidInput.kind, message)
    await response(scope, receive, send)
