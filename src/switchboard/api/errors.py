"""The one place domain errors become HTTP answers: `{ok: false, error: {type, message}}`."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from switchboard.shared.errors import (
    BrokerUnavailable,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    StoreUnavailable,
    SwitchboardError,
    Unavailable,
)

log = logging.getLogger("switchboard.api")

STATUS = {InvalidInput: 400, NotFound: 404, Forbidden: 403, Conflict: 409, Unavailable: 503}


def error_response(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The contract's error body."""
    return JSONResponse(
        {"ok": False, "error": {"type": kind, "message": message}},
        status_code=status,
        headers=headers,
    )


def openai_error_response(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """OpenAI's error body, `{error: {message, type, param, code}}` (the `/v1/` routes)."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": code}},
        status_code=status,
        headers=headers,
    )


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception to a JSON answer; never a stack trace."""

    @app.exception_handler(SwitchboardError)
    async def domain_error(request: Request, exc: SwitchboardError) -> JSONResponse:
        status = next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 400)
        headers = None
        if isinstance(exc, Unavailable):
            headers = {"Retry-After": str(exc.retry_after_s)}
        if isinstance(exc, StoreUnavailable | BrokerUnavailable):
            # An expected condition: one line, no traceback (the client is told to retry).
            what = "Redis" if isinstance(exc, StoreUnavailable) else "the broker"
            cause = exc.__cause__ or exc.fields.get("detail") or exc.message
            log.warning(
                "%s %s: 503, %s unavailable: %s", request.method, request.url.path, what, cause
            )
        return error_response(status, exc.kind, exc.message, headers)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            parts.append(f"{loc}: {err.get('msg', 'invalid')}")
        return error_response(400, "invalid_request", "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "error"
        )
        return error_response(exc.status_code, kind, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, _: ClientDisconnect) -> JSONResponse:
        # An expected condition: one WARNING line. Handled here, not by the catch-all below,
        # so the server does not log the same exception again as an error in the app.
        log.warning(
            "%s %s: the client went away before its request was read",
            request.method,
            request.url.path,
        )
        return error_response(499, "client_closed", "the client closed the request")

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        # A bug: the traceback is logged (an expected condition is cut to one WARNING line
        # by the log handler, `logs.ExpectedConditions`).
        log.exception("%s %s: 500, unhandled error", request.method, request.url.path)
        return error_response(500, "internal", "internal error")
