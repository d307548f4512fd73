"""Chat-completion request bodies without the OpenAI SDK's per-request type walk.

Before every `chat.completions.create`, the OpenAI SDK "transforms" the request body: it
walks the data against the `CompletionCreateParams` annotations to rename aliased keys and
format dates or files. For a chat completion nothing is aliased or formatted, so the walk
returns the same data, minus the omitted arguments; but it tries every member of every
union (a message is one of six kinds) on every message, and costs about 0.8 ms of CPU for a
two-message request: a quarter of what the SDK and pydantic-ai spend on the request in all.
In a fan-out, a worker process makes a thousand of them at once.

`install` puts a shortcut in front of the SDK's transform for chat completions only. It
applies when both hold, and otherwise leaves the SDK's transform to do its work:

- the parameter types (checked once) declare no alias and no format anywhere;
- the body is plain JSON data (dicts with string keys, lists, strings, numbers, booleans,
  None) once the top-level omitted arguments are dropped.

For such a body the SDK's transform is the identity, so the request sent is the same.

Put in place when a process builds its first OpenAI model, only with the fast paths on
(``Settings.fast_paths``, handed to `models.resolve_model`): off, the SDK is left unpatched.
"""

from __future__ import annotations

import threading
import typing
from collections.abc import Callable, Coroutine
from functools import cache
from typing import Any

from switchboard.shared.config import Settings

_PLAIN_SCALARS = (str, int, float, bool, type(None))
_lock = threading.Lock()
_installed = False


def is_plain(value: Any) -> bool:
    """Whether ``value`` is JSON data the SDK's transform leaves as it is."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if kind is dict:
        return all(type(k) is str and is_plain(v) for k, v in value.items())
    if kind is list:
        return all(is_plain(v) for v in value)
    return False


def declares_transforms(tp: Any, _seen: set[int] | None = None) -> bool:
    """Whether a parameter type, anywhere inside it, has an alias or a format to apply."""
    seen = _seen if _seen is not None else set()
    if id(tp) in seen:
        return False
    seen.add(id(tp))
    value = getattr(tp, "__value__", None)  # a `type X = ...` alias
    if value is not None and type(tp).__name__ == "TypeAliasType":
        return declares_transforms(value, seen)
    if typing.get_origin(tp) is typing.Annotated:
        base, *meta = typing.get_args(tp)
        if any(getattr(m, "alias", None) or getattr(m, "format", None) for m in meta):
            return True
        return declares_transforms(base, seen)
    if typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        return any(declares_transforms(h, seen) for h in hints.values())
    return any(declares_transforms(arg, seen) for arg in typing.get_args(tp))


@cache
def _shortcut_types() -> frozenset[type]:
    """The chat-completion parameter types the shortcut may stand in for (none if any of
    them declares an alias or a format)."""
    from openai.types.chat import completion_create_params as params

    types = (params.CompletionCreateParamsNonStreaming, params.CompletionCreateParamsStreaming)
    if any(declares_transforms(t) for t in types):
        return frozenset()
    return frozenset(types)


def plain_body(data: Any, expected_type: Any) -> dict[str, Any] | None:
    """The body as the SDK's transform would return it, or None when only the SDK can say."""
    from openai._utils import is_given

    if expected_type not in _shortcut_types() or type(data) is not dict:
        return None
    body = {k: v for k, v in data.items() if is_given(v)}
    return body if is_plain(body) else None


Transform = Callable[[Any, Any], Coroutine[Any, Any, Any]]


def shortcut(original: Transform) -> Transform:
    """``original`` (the SDK's async transform) with the shortcut in front of it."""

    async def transform(data: Any, expected_type: Any) -> Any:
        body = plain_body(data, expected_type)
        return body if body is not None else await original(data, expected_type)

    transform.__wrapped__ = original  # type: ignore[attr-defined]
    return transform


def install(settings: Settings) -> bool:
    """With the fast paths on, put the shortcut in place (`install_shortcut`). True when
    it is in place; off, the SDK is left as it is."""
    return install_shortcut() if settings.fast_paths else False


def install_shortcut() -> bool:
    """Put the shortcut in front of the transform of the SDK's async chat completions
    (once per process; it imports that part of the SDK). True."""
    global _installed
    with _lock:
        if _installed:
            return True
        from openai.resources.chat.completions import completions as module

        names = vars(module)  # the name the module's `create` calls
        names["async_maybe_transform"] = shortcut(names["async_maybe_transform"])
        _installed = True
    return True
