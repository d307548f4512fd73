"""Tracing off (no OTLP endpoint set): nothing is installed and no OpenTelemetry SDK,
exporter or instrumentation is imported; the run's spans are the shared no-op."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

# Run in a fresh interpreter: the test process may have imported anything already.
_PROBE = """
import sys
from switchboard import telemetry
import switchboard.shared.runtime.executor, switchboard.workers.app, switchboard.api.app
from switchboard.shared.config import Settings
from switchboard.workers.app import create_celery_app
from celery.signals import beat_init, worker_init

before = {m for m in sys.modules if m.startswith("opentelemetry")}
create_celery_app(Settings(redis_url="redis://127.0.0.1:1/0"))
assert telemetry.install("worker") is False
assert telemetry.traceparent() is None
parent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
span = telemetry.invoke_agent("agent:main:main", "r1", parent=parent)
assert span is telemetry.model_call(object()) is telemetry.resumed("x")
with span:
    telemetry.record_usage("builtin/echo", None)
after = {m for m in sys.modules if m.startswith("opentelemetry")}
assert after == before, sorted(after - before)
# (redis-py imports the SDK's metrics when the SDK is installed: not a tracer.)
ours = ("opentelemetry.sdk.trace", "opentelemetry.exporter", "opentelemetry.instrumentation")
assert not [m for m in after if m.startswith(ours)], sorted(after)
assert "watch_celery" not in repr(worker_init.receivers + beat_init.receivers)
print("off")
"""


def test_without_an_endpoint_nothing_is_installed_or_imported() -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT unset, `install` and the span helpers import no
    OpenTelemetry module, connect no Celery signal and hand out one shared no-op."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    }
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "off"


def test_with_an_endpoint_install_sets_up_the_sdk_exporter() -> None:
    """With an endpoint set, `install` installs the SDK's provider with the OTLP/HTTP
    exporter, and a run's span carries a traceparent new runs record."""
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    probe = """
from opentelemetry import trace
from switchboard import telemetry
assert telemetry.install("api") is True
assert type(trace.get_tracer_provider()).__module__.startswith("opentelemetry.sdk")
with telemetry.invoke_agent("agent:main:main", "r1", parent=None):
    assert telemetry.traceparent().startswith("00-")
print("on")
"""
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "on"
