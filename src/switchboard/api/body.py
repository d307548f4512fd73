"""JSON request bodies, parsed whatever the Content-Type, with clear 400s for bad input.

The handlers read the body themselves (any Content-Type, one error shape); the OpenAPI
schema still describes what they accept, through ``openapi_extra``: ``json_body_schema``
for one model, ``rpc_body_schema`` for `/rpc` (a union over ``method``, each with its params
model) and ``tool_body_schema`` for `/tools/invoke` (a union over ``tool``, each with its
arguments schema). The schemas are inlined (no ``$ref``), so they stand alone in the
document.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, TypeVar, Union

from fastapi import Request
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    TypeAdapter,
    ValidationError,
    create_model,
)

from switchboard.shared.errors import InvalidInput
from switchboard.shared.gateway.params import describe_validation_error

M = TypeVar("M", bound=BaseModel)
_SESSION_KEY_SCHEMA = {
    "type": "string",
    "maxLength": 512,
    "description": "The session the tool acts for (default: the default agent's main session).",
}


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
    return _request_body(_inline_refs(model.model_json_schema()))


class _RpcCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: StrictStr | int | None = None


def rpc_body_schema(methods: Mapping[str, type[BaseModel]]) -> dict[str, Any]:
    """`openapi_extra` for `/rpc`: `{method, params}` discriminated by ``method``."""
    variants: list[type[BaseModel]] = []
    for name, params in sorted(methods.items()):
        required = any(f.is_required() for f in params.model_fields.values())
        fields: dict[str, Any] = {
            "method": (Literal[name], ...),
            "params": (params, ...) if required else (params | None, None),
        }
        title = "Rpc_" + name.replace(".", "_")
        variants.append(create_model(title, __base__=_RpcCall, **fields))
    # A union built at runtime is not a static type; pydantic still reads it.
    union: Any = Annotated[Union[tuple(variants)], Field(discriminator="method")]  # noqa: UP007
    schema = _inline_refs(TypeAdapter[Any](union).json_schema())
    # Inlined branches have no names to map to; each pins `method` with a const.
    schema["discriminator"] = {"propertyName": "method"}
    return _request_body(schema)


def tool_body_schema(tools: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """`openapi_extra` for `/tools/invoke`: `{tool, args, sessionKey}`, one variant per tool."""
    variants = [
        {
            "type": "object",
            "title": name,
            "properties": {
                "tool": {"const": name},
                "args": dict(parameters),
                "sessionKey": _SESSION_KEY_SCHEMA,
            },
            "required": ["tool"],
        }
        for name, parameters in tools
    ]
    return _request_body({"oneOf": variants})


def _request_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its local ``#/$defs/...`` references replaced by their targets."""
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                target = inline(defs[ref.removeprefix("#/$defs/")])
                return {**target, **{k: inline(v) for k, v in node.items() if k != "$ref"}}
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    out: dict[str, Any] = inline(schema)
    return out
