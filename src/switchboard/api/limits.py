"""ASGI middleware that answers 413 to request bodies over the limit, before parsing."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 2 * 1024 * 1024
# Paths whose bodies are read as they arrive, under limits of their own (file uploads,
# `batches.maxFileBytes`): not limited here.
STREAMED_PATHS = frozenset({"/v1/files"})


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
