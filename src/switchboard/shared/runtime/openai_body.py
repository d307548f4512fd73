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

The same goes for the answer: the SDK builds a chat completion from the response's JSON
with its own `construct_type`, a walk in Python of the data against the model's
annotations that validates nothing, about 90 µs of CPU for a one-choice answer. With
the shortcut pydantic validates it in one step (`parsed_completion`), in strict mode: only
data of exactly the declared types (an answer the SDK's construct keeps as it is), else the
SDK builds it as before. The completion is the same: same classes, same fields and extra
fields, the same dumps. That costs about 7 µs; pydantic-ai validates the completion
again, leniently, after it.

Put in place when a process builds its first OpenAI model, only with the fast paths on
(``Settings.fast_paths``, handed to `models.resolve_model`): off, the SDK is left unpatched.
"""

from __future__ import annotations

import threading
import typing
from collections.abc import Callable, Coroutine
from functools import cache
from typing import Any

from pydantic import BaseModel, ValidationError

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


@cache
def _completion_type() -> type[BaseModel]:
    from openai.types.chat import ChatCompletion

    return ChatCompletion


def parsed_completion(data: Any, cast_to: Any) -> BaseModel | None:
    """A chat completion's JSON as the SDK's construct makes it, validated by pydantic in
    strict mode; None when it is not a chat completion of exactly the declared types (the
    SDK builds it then)."""
    completion = _completion_type()
    if cast_to is not completion or type(data) is not dict:
        return None
    try:
        parsed: BaseModel = completion.model_validate(data, strict=True)
    except ValidationError:
        return None
    return parsed


ProcessData = Callable[..., Any]


def response_shortcut(original: ProcessData) -> ProcessData:
    """``original`` (the SDK client's `_process_response_data`) with `parsed_completion` in
    front of it; a client with strict response validation is left to the SDK."""

    def process(self: Any, *, data: Any, cast_to: Any, response: Any) -> Any:
        if not self._strict_response_validation:
            parsed = parsed_completion(data, cast_to)
            if parsed is not None:
                return parsed
        return original(self, data=data, cast_to=cast_to, response=response)

    process.__wrapped__ = original  # type: ignore[attr-defined]
    process.switchboard_shortcut = True  # type: ignore[attr-defined]
    return process


def install_shortcut() -> bool:
    """Put the shortcuts in front of the transform of the SDK's async chat completions and
    of its async clients' response parsing (once per process; it imports that part of the
    SDK). True."""
    global _installed
    with _lock:
        if _installed:
            return True
        from openai._base_client import AsyncAPIClient
        from openai.resources.chat.completions import completions as module

        names = vars(module)  # the name the module's `create` calls
        names["async_maybe_transform"] = shortcut(names["async_maybe_transform"])
        process = AsyncAPIClient._process_response_data
        if not getattr(process, "switchboard_shortcut", False):  # not put in place before
            AsyncAPIClient._process_response_data = response_shortcut(process)  # type: ignore[method-assign]
        _installed = True
    return True
