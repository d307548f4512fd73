"""A2A error answers without Python exception text.

The SDK's JSON-RPC dispatcher answers a body it cannot parse, params it cannot read and an
unexpected failure with the exception's own text (`str(e)`, in ``message`` or in
``data.parseError``). `without_exception_text` puts a fixed sentence in its place, per
JSON-RPC error code; errors the product raised itself (a message of its own, no data) pass
as they are. The exception is still logged, by the SDK.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse, Response

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32602, -32603
# What each error code says in place of an exception's text.
_PLAIN = {
    PARSE_ERROR: "invalid JSON payload",
    INVALID_REQUEST: "invalid JSON-RPC request",
    INVALID_PARAMS: "invalid params: they do not match the method's request message",
    INTERNAL_ERROR: "internal error (logged on the server)",
}
# Codes whose message is always an exception's text (the others only carry it in data).
_MESSAGE_IS_TEXT = frozenset({PARSE_ERROR, INTERNAL_ERROR})


def without_exception_text(response: Response) -> Response:
    """``response``, or a copy of it whose JSON-RPC error carries no exception text."""
    if not isinstance(response, JSONResponse) or b'"error"' not in response.body:
        return response
    try:
        answer: Any = orjson.loads(response.body)
    except orjson.JSONDecodeError:
        return response
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict) or error.get("code") not in _PLAIN:
        return response
    code = error["code"]
    if code not in _MESSAGE_IS_TEXT and "data" not in error:
        return response  # a message the product or the SDK wrote, no exception in it
    answer["error"] = {"code": code, "message": _PLAIN[code]}
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    return JSONResponse(answer, status_code=response.status_code, headers=headers)
