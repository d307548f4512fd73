"""Reading tool arguments the way OpenClaw does, so models that work there work here.

Strings are trimmed and an empty string counts as absent; string params also accept their
snake_case spelling. Numbers count only when they are finite numbers (a string "5" is
ignored and the default applies); booleans only when they are real booleans.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from switchboard.shared.errors import InvalidInput

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def _snake(name: str) -> str:
    return _CAMEL.sub("_", name).lower()


def read_string(args: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    """A trimmed string param (camelCase or snake_case key); `<name> required` if missing."""
    value = args.get(name)
    if value is None:
        value = args.get(_snake(name))
    if isinstance(value, str) and value.strip():
        return value.strip()
    if value is not None and not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string", field=name)
    if required:
        raise InvalidInput(f"{name} required", field=name)
    return None


def read_string_list(args: Mapping[str, Any], name: str) -> list[str] | None:
    """A list of strings (a single string is accepted as a one-item list)."""
    value = args.get(name)
    if value is None:
        value = args.get(_snake(name))
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise InvalidInput(f"{name} must be a list of strings", field=name)
    return [v.strip() for v in value if isinstance(v, str) and v.strip()]


def read_number(args: Mapping[str, Any], name: str) -> float | None:
    """A finite number param, else None (strings and booleans do not count)."""
    value = args.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return None
    return float(value)


def read_int(
    args: Mapping[str, Any],
    name: str,
    *,
    default: int | None,
    lo: int | None = None,
    hi: int | None = None,
) -> int | None:
    """A floored integer clamped to [lo, hi], or the default when absent."""
    value = read_number(args, name)
    if value is None:
        return default
    out = math.floor(value)
    if lo is not None:
        out = max(lo, out)
    if hi is not None:
        out = min(hi, out)
    return out


def read_bool(args: Mapping[str, Any], name: str, *, default: bool = False) -> bool:
    """A real boolean param, else the default."""
    value = args.get(name)
    return value if isinstance(value, bool) else default


def read_non_negative_int(args: Mapping[str, Any], name: str) -> int | None:
    """An integer ≥ 0 (a number, or a string holding one; camelCase or snake_case key), None
    when absent or blank; anything else is `<name> must be a non-negative integer`, as
    OpenClaw's ``readNonNegativeIntegerParam`` says."""
    value = args.get(name)
    if value is None:
        value = args.get(_snake(name))
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or number < 0 or number != int(number):
        raise InvalidInput(f"{name} must be a non-negative integer", field=name)
    return int(number)
