"""JSON request bodies, parsed whatever the Content-Type, with clear 400s for bad input."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from switchboard.shared.errors import InvalidInput
from switchboard.shared.gateway.params import describe_validation_error

M = TypeVar("M", bound=BaseModel)


async def parse_json_body(request: Request, model: type[M]) -> M:
    """The body validated as ``model``; invalid JSON, UTF-8 or fields → InvalidInput."""
    raw = await request.body()
    if not raw:
        raise InvalidInput("request body required (JSON object)", field="body")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise InvalidInput("request body is not valid JSON", field="body") from None
        msg = describe_validation_error(exc).replace("invalid params", "invalid request", 1)
        raise InvalidInput(msg, field="body") from None


def json_body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` declaring a JSON request body of ``model`` (for docs and fuzzers)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
