"""Resolve `provider/model` references (as in OpenClaw) to pydantic-ai models.

`builtin/echo` is the offline model. Otherwise the provider is looked up in
`models.providers.<name>` (`baseUrl`, `apiKey`, `api`): OpenAI-style apis (`openai-completions`,
`openai-chat`, `openai`, or none) use the Chat Completions API, `openai-responses` the Responses
API, `anthropic-messages` (or a provider named `anthropic`) the Messages API. The providers
`openai` and `anthropic` also work unconfigured, from `OPENAI_API_KEY` / `OPENAI_BASE_URL` and
`ANTHROPIC_API_KEY`. `OPENAI_API_KEY` is only ever sent to the `openai` provider, never to
another configured server.

Built models are cached per (model spec, running event loop): a model holds an async HTTP
client whose connections belong to the loop that opened them. The client is handed to
pydantic-ai's provider, which closes only clients it made itself, so `async with model:`
leaves it open: `close_clients` closes every cached model's client on its own loop (a
worker shutting down), and a model evicted from the cache has its client closed on its
loop. A loop that ends without either (e.g. each `asyncio.run` in a script) leaves the
client's sockets to garbage collection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model
from pydantic_ai.settings import ModelSettings

from switchboard.shared.errors import InvalidInput
from switchboard.shared.runtime.echo import ECHO_MODEL_NAME, echo_model

if TYPE_CHECKING:
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.providers.openai_compatible import OpenAICompatibleProvider

# The provider SDKs (openai, anthropic) are imported when a model of theirs is first built:
# they take seconds to import, and a process that never calls them (the api, `switchboard
# mcp`, a worker on the offline model) starts without paying for them.

__all__ = [
    "HTTP_TIMEOUT_S",
    "ProviderLike",
    "clear_model_cache",
    "close_clients",
    "model_slots",
    "preload",
    "resolve_model",
    "validate_model_ref",
]

log = logging.getLogger("switchboard.run")

# Per request; the product enforces its own, usually shorter, run deadlines on top.
HTTP_TIMEOUT_S = 120.0
_CACHE_SIZE = 32

# Model requests one event loop has out at once; the others wait for a slot before their
# request starts. A worker keeps thousands of runs on a loop: sent all at once, the
# requests past the client's connections would wait for one with their timeout running,
# and time out when the loop is slower than the queue is long.
MODEL_SLOTS_PER_LOOP = 500
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)
_slots_lock = threading.Lock()


def model_slots() -> asyncio.Semaphore:
    """The running loop's slots for model requests (`MODEL_SLOTS_PER_LOOP`)."""
    loop = asyncio.get_running_loop()
    with _slots_lock:
        slots = _slots.get(loop)
        if slots is None:
            slots = _slots[loop] = asyncio.Semaphore(MODEL_SLOTS_PER_LOOP)
        return slots


_OPENAI_CHAT_APIS = (None, "openai-completions", "openai-chat", "openai")

Kind = Literal["echo", "openai-chat", "openai-responses", "anthropic"]
_LoopRef = weakref.ref[asyncio.AbstractEventLoop] | None


class ProviderLike(Protocol):
    """The fields of `models.providers.<name>` this module reads (see `shared.config`)."""

    @property
    def base_url(self) -> str | None: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def api(self) -> str | None: ...


@dataclass(frozen=True)
class _ModelSpec:
    """Everything a model is built from; also its cache key."""

    kind: Kind
    provider: str
    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)


# (spec, id of the running loop) -> (model, the loop itself, to catch a reused id)
_cache: OrderedDict[tuple[_ModelSpec, int | None], tuple[Model, _LoopRef]] = OrderedDict()
_cache_lock = threading.Lock()


def resolve_model(
    ref: str,
    providers: Mapping[str, ProviderLike],
    env: Mapping[str, str] | None = None,
) -> Model:
    """Build (or reuse) the model for `ref`; raise `InvalidInput` if it cannot be used."""
    spec = _model_spec(ref, providers, os.environ if env is None else env)
    loop = _running_loop()
    key = (spec, None if loop is None else id(loop))
    with _cache_lock:
        cached = _cache.get(key)
        if cached is not None and _deref(cached[1]) is loop:
            _cache.move_to_end(key)
            return cached[0]
    model = _build(spec, ref)
    with _cache_lock:
        _cache[key] = (model, None if loop is None else weakref.ref(loop))
        _cache.move_to_end(key)
        evicted = []
        while len(_cache) > _CACHE_SIZE:
            evicted.append(_cache.popitem(last=False)[1])
    for old, old_loop in evicted:
        _close_on(old, _deref(old_loop), wait_s=None)
    return model


def close_clients(timeout_s: float = 5.0) -> None:
    """Close the HTTP clients of every built model on its own loop (a worker shutting down),
    waiting up to ``timeout_s`` for each; forget them all."""
    with _cache_lock:
        entries = list(_cache.values())
        _cache.clear()
    for model, loop_ref in entries:
        _close_on(model, _deref(loop_ref), wait_s=timeout_s)


def _close_on(model: Model, loop: asyncio.AbstractEventLoop | None, wait_s: float | None) -> None:
    """Close ``model``'s client on ``loop`` if that loop still runs (else it has gone with it)."""
    close = getattr(getattr(model, "client", None), "close", None)
    if close is None or loop is None or not loop.is_running() or loop.is_closed():
        return
    future = asyncio.run_coroutine_threadsafe(close(), loop)
    if wait_s is not None:
        try:
            future.result(wait_s)
        except Exception as exc:  # shutting down: a client that will not close is dropped
            log.debug("closing a model client failed: %s", exc)


def preload(refs: Iterable[str], providers: Mapping[str, ProviderLike]) -> list[str]:
    """Import the provider SDKs these model refs need; returns the kinds imported.

    The SDKs take seconds to import, and an import holds the module lock and the GIL: a
    worker does it at start for the models its config names, so the first runs on a model
    (a batch of sub-agents, say) do not all wait for it. Refs that cannot be used are
    skipped (a run on one fails with a clear error)."""
    kinds: set[Kind] = set()
    for ref in refs:
        try:
            kinds.add(_model_spec(ref, providers, os.environ).kind)
        except InvalidInput:
            continue
    if kinds & {"openai-chat", "openai-responses"}:
        import pydantic_ai.models.openai
        import pydantic_ai.providers.openai
        import pydantic_ai.providers.openai_compatible
    if "anthropic" in kinds:
        import pydantic_ai.models.anthropic
        import pydantic_ai.providers.anthropic  # noqa: F401
    return sorted(kinds)


def validate_model_ref(ref: str, providers: Mapping[str, ProviderLike]) -> None:
    """Check that `ref` names a usable provider and api, without building a client."""
    _model_spec(ref, providers, {})


def clear_model_cache() -> None:
    """Forget every built model (their clients close when garbage-collected)."""
    with _cache_lock:
        _cache.clear()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _deref(ref: _LoopRef) -> asyncio.AbstractEventLoop | None:
    return None if ref is None else ref()


def _model_spec(
    ref: str, providers: Mapping[str, ProviderLike], env: Mapping[str, str]
) -> _ModelSpec:
    provider, _, model = ref.partition("/")
    if not provider or not model:
        raise _invalid(ref, "expected provider/model")
    if provider == "builtin":
        if model != ECHO_MODEL_NAME:
            raise _invalid(ref, "the only builtin model is builtin/echo")
        return _ModelSpec("echo", provider, model)
    cfg = providers.get(provider)
    if cfg is not None:
        return _configured_spec(ref, provider, model, cfg, env)
    if provider == "openai":
        return _ModelSpec(
            "openai-chat", provider, model, env.get("OPENAI_BASE_URL"), env.get("OPENAI_API_KEY")
        )
    if provider == "anthropic":
        return _ModelSpec("anthropic", provider, model, None, env.get("ANTHROPIC_API_KEY"))
    raise _invalid(ref, f"unknown provider {provider!r}")


def _configured_spec(
    ref: str, provider: str, model: str, cfg: ProviderLike, env: Mapping[str, str]
) -> _ModelSpec:
    api, base_url, api_key = cfg.api, cfg.base_url, cfg.api_key
    if api == "anthropic-messages" or (provider == "anthropic" and api is None):
        return _ModelSpec(
            "anthropic", provider, model, base_url, api_key or env.get("ANTHROPIC_API_KEY")
        )
    if provider == "openai":
        api_key = api_key or env.get("OPENAI_API_KEY")
        base_url = base_url or env.get("OPENAI_BASE_URL")
    elif not base_url:
        raise _invalid(ref, f"provider {provider!r} has no baseUrl")
    if api in _OPENAI_CHAT_APIS:
        return _ModelSpec("openai-chat", provider, model, base_url, api_key)
    if api == "openai-responses":
        return _ModelSpec("openai-responses", provider, model, base_url, api_key)
    raise _invalid(ref, f"provider {provider!r} has unsupported api {api!r}")


def _build(spec: _ModelSpec, ref: str) -> Model:
    if spec.kind == "echo":
        return echo_model()
    settings = ModelSettings(timeout=HTTP_TIMEOUT_S)
    try:
        if spec.kind == "anthropic":
            return _anthropic_model(spec, settings)
        return _openai_model(spec, settings)
    except UserError as exc:  # e.g. a missing API key
        raise _invalid(ref, str(exc)) from exc


def _anthropic_model(spec: _ModelSpec, settings: ModelSettings) -> Model:
    if not spec.api_key:
        raise UserError("set ANTHROPIC_API_KEY or models.providers.<name>.apiKey")
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    provider = AnthropicProvider(api_key=spec.api_key, base_url=spec.base_url)
    return AnthropicModel(spec.model, provider=provider, settings=settings)


def _openai_model(spec: _ModelSpec, settings: ModelSettings) -> Model:
    if spec.provider == "openai" and not spec.api_key and not spec.base_url:
        raise UserError("set OPENAI_API_KEY or models.providers.openai.apiKey")
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel

    model_class: type[OpenAIChatModel] | type[OpenAIResponsesModel] = (
        OpenAIResponsesModel if spec.kind == "openai-responses" else OpenAIChatModel
    )
    return model_class(spec.model, provider=_openai_provider(spec), settings=settings)


def _openai_provider(spec: _ModelSpec) -> OpenAIProvider | OpenAICompatibleProvider:
    """OpenAI itself (or a proxy to it) gets OpenAI's profile; any other server the generic one."""
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.providers.openai_compatible import OpenAICompatibleProvider

    api_key = spec.api_key or "none"  # local servers often need no key, the client demands one
    http = _openai_http_client()
    if spec.provider == "openai":
        return OpenAIProvider(base_url=spec.base_url, api_key=api_key, http_client=http)
    assert spec.base_url is not None  # checked by _configured_spec
    return OpenAICompatibleProvider(
        spec.provider, base_url=spec.base_url, api_key=api_key, http_client=http
    )


def _openai_http_client() -> Any:
    """The OpenAI SDK's client over aiohttp (its `aiohttp` extra), with the SDK's defaults.

    A worker keeps hundreds of model requests in flight on one loop. The default transport
    looks at every pooled connection (a system call each) whenever a request starts or
    ends, which grows with the square of the requests in flight; aiohttp's pool does not.
    The SDK documents this transport "for improved concurrency performance"."""
    from openai import DefaultAioHttpClient

    return DefaultAioHttpClient(timeout=HTTP_TIMEOUT_S)


def _invalid(ref: str, reason: str) -> InvalidInput:
    return InvalidInput(f"invalid model: {ref} ({reason})", field="model", model=ref)
