"""Encoding of hash fields: every value is stored as text; structured values as JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """Compact JSON text (integers beyond 64 bits, e.g. from a model's tool call, included)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False, default=str)


def _plain(value: Any) -> Any:
    """The value as stdlib json can write it the way orjson would (non-finite floats → null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def loads(text: str | bytes) -> Any:
    """Parse JSON text."""
    return orjson.loads(text)


def encode_value(value: Any) -> str | None:
    """One hash value as text; None means 'delete the field'."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return dumps(value)


def text_fields(fields: Mapping[str, Any]) -> dict[str, str | None]:
    """Hash fields as text values, None for a field to delete (Lua ``set_table``)."""
    return {k: encode_value(v) for k, v in fields.items()}


def fields_json(fields: Mapping[str, Any]) -> str:
    """A JSON object of text values for the Lua ``set_fields`` helper (null = HDEL)."""
    if not fields:
        return ""
    return dumps(text_fields(fields))


def as_text(value: Any) -> str:
    """Decode a Redis reply element (bytes or str or int) to text."""
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)


def decode_hash(raw: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    """A HGETALL reply as a str → str dict."""
    out: dict[str, str] = {}
    for k, v in raw.items():
        key = k.decode() if isinstance(k, bytes) else k
        out[key] = v.decode() if isinstance(v, bytes) else v
    return out


def decode_flat_hash(flat: Sequence[bytes | str]) -> dict[str, str]:
    """A Lua script's HGETALL reply (field, value, field, value, ...) as a str → str dict."""
    try:
        items = map(bytes.decode, flat)  # type: ignore[arg-type]  # bytes: the usual reply
        return dict(zip(items, items, strict=False))  # a fifth faster than a comprehension
    except TypeError:  # a client that decodes replies itself
        texts = iter([x.decode() if isinstance(x, bytes) else x for x in flat])
        return dict(zip(texts, texts, strict=False))


def as_int(value: str | None) -> int | None:
    """An integer field, or None when absent or not a number."""
    if value is None or value == "":
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def as_bool(value: str | None) -> bool | None:
    """A boolean field stored as "1"/"0"."""
    if value is None:
        return None
    return value in ("1", "true", "True")


def as_json(value: str | None, default: Any = None) -> Any:
    """A JSON field, or the default when absent."""
    if value is None or value == "":
        return default
    return loads(value)
