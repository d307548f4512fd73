"""Tracing over OpenTelemetry: OTLP/HTTP export, installed only when an endpoint is set.

With ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, each
process (api, worker, beat) installs an SDK tracer provider exporting in batches over
OTLP/HTTP, and the official FastAPI, Celery, httpx and redis instrumentations; the
standard ``OTEL_*`` variables (service name, resource attributes, sampler, batch delays)
apply as the SDK reads them. Trace context crosses the queue in task headers (the Celery
instrumentation), and a run keeps the context it was created in (its ``traceparent``
field): its ``invoke_agent`` span is a child of the request, tool call or flow step that
created it, so a sessions_send's target run, reply-back steps, announces and a spawn's
children are in the requester's trace. Model requests are ``chat`` spans. Attributes
follow the OpenTelemetry GenAI semantic conventions, plus ``switchboard.session_key`` and
``switchboard.run_id``.

With neither variable set nothing is installed and no OpenTelemetry module is imported:
the spans below are one shared no-op object and ``traceparent()`` is None. The tracer is
process-wide state, as OpenTelemetry's own provider is: it is set once by `install`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from switchboard.shared import keys as sk

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = [
    "enabled",
    "execute_tool",
    "install",
    "instrument_api",
    "invoke_agent",
    "model_call",
    "record_usage",
    "resumed",
    "traceparent",
    "watch_celery",
]

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_SCOPE = "switchboard"


class UsageSpan(Protocol):
    """A span a model call's usage is recorded on."""

    def usage(self, usage: Any) -> None: ...


class ToolSpan(Protocol):
    """A span a tool call's error is recorded on."""

    def error(self, kind: str, message: str) -> None: ...


class _Off:
    """The span when tracing is off: a context manager that does nothing."""

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def usage(self, usage: Any) -> None:
        return None

    def error(self, kind: str, message: str) -> None:
        return None


_OFF = _Off()
# The installed tracer (None: tracing off). Set once per process by `install`.
_tracer: Any = None


def enabled() -> bool:
    """An OTLP endpoint is configured in the environment."""
    return any(os.environ.get(name) for name in ENDPOINT_VARS)


# The modules `install` imports, as pip names them (the `otel` extra installs them all).
_PACKAGES = {
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry.instrumentation.celery": "opentelemetry-instrumentation-celery",
    "opentelemetry.instrumentation.fastapi": "opentelemetry-instrumentation-fastapi",
    "opentelemetry.instrumentation.httpx": "opentelemetry-instrumentation-httpx",
    "opentelemetry.instrumentation.redis": "opentelemetry-instrumentation-redis",
}


def missing_packages() -> list[str]:
    """The packages tracing needs that are not installed (none with the `otel` extra)."""
    return [package for module, package in _PACKAGES.items() if not _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing, or blocked
        return False


def tracing() -> bool:
    """Tracing is installed in this process (`install`)."""
    return _tracer is not None


def install(role: str) -> bool:
    """Install tracing for this process (``role``: api, worker or beat) if an endpoint is
    set; True when tracing is on. Once per process: a second call changes nothing."""
    global _tracer
    if _tracer is not None:
        return True
    if not enabled():
        return False
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {"switchboard.role": role}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = f"switchboard-{role}"
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    RedisInstrumentor().instrument(tracer_provider=provider)
    HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    _tracer = provider.get_tracer(_SCOPE)
    return True


def instrument_api(app: FastAPI) -> None:
    """Install tracing for the api process and trace ``app``'s requests (server spans)."""
    if not install("api"):
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, exclude_spans=["receive", "send"])


def watch_celery() -> None:
    """Install tracing as this process starts a Celery worker or beat (nothing is
    connected when no endpoint is set)."""
    if not enabled():
        return
    from celery.signals import beat_init, worker_init

    def on_worker(sender: Any = None, **_: Any) -> None:
        install("worker")

    def on_beat(sender: Any = None, **_: Any) -> None:
        install("beat")

    worker_init.connect(on_worker, weak=False)
    beat_init.connect(on_beat, weak=False)


def traceparent() -> str | None:
    """The current trace context as a W3C ``traceparent`` (None when off or outside a
    span): stored with a new run so its execution joins the trace that created it."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def _context_of(parent: str | None) -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": parent}) if parent else None


@contextlib.contextmanager
def _resumed_on(parent: str) -> Iterator[None]:
    from opentelemetry import context

    token = context.attach(_context_of(parent))
    try:
        yield
    finally:
        context.detach(token)


def resumed(parent: str | None) -> contextlib.AbstractContextManager[Any]:
    """Continue the trace ``parent`` names (a stored ``traceparent``) inside the block:
    work done for an ended run (its follow-up step) joins that run's trace."""
    if _tracer is None or not parent:
        return _OFF
    return _resumed_on(parent)


def invoke_agent(
    session_key: str, run_id: str, *, parent: str | None
) -> contextlib.AbstractContextManager[Any]:
    """The span of one agent run (``invoke_agent``), a child of ``parent`` (the stored
    ``traceparent`` of the run) when it has one, else of the current context."""
    if _tracer is None:
        return _OFF
    from opentelemetry.trace import SpanKind

    agent_id = sk.agent_id_of(session_key)
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent_id,
        "gen_ai.agent.id": agent_id,
        "gen_ai.conversation.id": session_key,
        "switchboard.session_key": session_key,
        "switchboard.run_id": run_id,
    }
    return _tracer.start_as_current_span(  # type: ignore[no-any-return]
        f"invoke_agent {agent_id}",
        context=_context_of(parent),
        kind=SpanKind.INTERNAL,
        attributes=attributes,
    )


class _ChatSpan:
    """A ``chat`` span open over one model request."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def usage(self, usage: Any) -> None:
        self._span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        self._span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)


@contextlib.contextmanager
def _chat(model: Any) -> Iterator[UsageSpan]:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    name = str(getattr(model, "model_name", "") or "unknown")
    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": name}
    provider = getattr(model, "system", None)
    if provider:
        attributes["gen_ai.provider.name"] = str(provider)
    run_attributes = getattr(trace.get_current_span(), "attributes", None) or {}
    for key in ("switchboard.session_key", "switchboard.run_id"):
        if run_attributes.get(key):
            attributes[key] = run_attributes[key]
    with _tracer.start_as_current_span(
        f"chat {name}", kind=SpanKind.CLIENT, attributes=attributes
    ) as span:
        yield _ChatSpan(span)


def model_call(model: Any) -> contextlib.AbstractContextManager[UsageSpan]:
    """The span of one request to ``model`` (a pydantic-ai model): a ``chat`` span whose
    ``usage`` records the request's token usage."""
    if _tracer is None:
        return _OFF
    return _chat(model)


def record_usage(model_ref: str, usage: Any) -> None:
    """Record a run's model (``provider/name``) and token usage on the current span (its
    ``invoke_agent``)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    provider, _, name = model_ref.partition("/")
    span = trace.get_current_span()
    span.set_attribute("gen_ai.request.model", name or provider)
    if name:
        span.set_attribute("gen_ai.provider.name", provider)
    span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)


class _ToolSpan:
    """An ``execute_tool`` span open over one tool call."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def error(self, kind: str, message: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute("error.type", kind)
        self._span.set_status(Status(StatusCode.ERROR, message))


@contextlib.contextmanager
def _tool(
    name: str, call_id: str | None, server: str, description: str | None
) -> Iterator[ToolSpan]:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.type": "function",
        "switchboard.tool.server": server,
    }
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    if description:
        attributes["gen_ai.tool.description"] = description
    run_attributes = getattr(trace.get_current_span(), "attributes", None) or {}
    for key in ("switchboard.session_key", "switchboard.run_id"):
        if run_attributes.get(key):
            attributes[key] = run_attributes[key]
    with _tracer.start_as_current_span(
        f"execute_tool {name}",
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield _ToolSpan(span)


def execute_tool(
    name: str, call_id: str | None, *, server: str, description: str | None = None
) -> contextlib.AbstractContextManager[ToolSpan]:
    """The span of one call of the tool ``name`` (as the model sees it) on the tool server
    ``server``: an ``execute_tool`` span (GenAI attributes, ``gen_ai.tool.call.id``) whose
    ``error`` records the tool error the model got back (``error.type``)."""
    if _tracer is None:
        return _OFF
    return _tool(name, call_id, server, description)
