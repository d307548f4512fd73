"""Thin Celery tasks: each loads ids, calls into the domain, and lets Redis hold the state.

The worker runs the threads pool: every thread keeps one asyncio event loop for its whole
life (model clients are bound to a loop), so one worker process keeps as many runs in
flight as it has threads. Deadlines are enforced by the product, not by Celery.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from functools import cache
from typing import Any, TypeVar

import redis
from celery import Celery
from celery.signals import worker_ready

from switchboard.shared.config import Settings
from switchboard.shared.errors import Unavailable
from switchboard.shared.runtime.executor import execute_run, resume_run
from switchboard.shared.runtime.sweeper import sweep
from switchboard.shared.services import Services

log = logging.getLogger("switchboard.worker")

T = TypeVar("T")
_local = threading.local()

# Redis blips are retried with backoff; the steps are idempotent.
_RETRY = {
    "autoretry_for": (Unavailable, redis.ConnectionError, redis.TimeoutError),
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "max_retries": 20,
}


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on this thread's long-lived event loop."""
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
    return loop.run_until_complete(coro)


def register_tasks(app: Celery, settings: Settings) -> None:
    """Register every task on ``app``."""

    @cache
    def build() -> Services:
        from switchboard.wiring import build_services
        from switchboard.workers.queue import CeleryQueue

        return build_services(settings, queue=CeleryQueue(app))

    def services() -> Services:
        # Tests (and embedders) may hand the app ready-made services.
        override = getattr(app, "services_override", None)
        return override if override is not None else build()

    @app.task(name="switchboard.run", shared=False, **_RETRY)  # type: ignore[untyped-decorator]
    def run(run_id: str, session_key: str) -> None:
        """Execute one agent run in its session."""
        run_async(execute_run(services(), run_id, session_key))

    @app.task(name="switchboard.resume", shared=False, **_RETRY)  # type: ignore[untyped-decorator]
    def resume(run_id: str, session_key: str) -> None:
        """Continue a parked run with the results it waited for."""
        run_async(resume_run(services(), run_id))

    @app.task(name="switchboard.sweep", shared=False, **_RETRY)  # type: ignore[untyped-decorator]
    def sweep_task() -> None:
        """Recover expired lanes and overdue parked runs."""
        sweep(services())

    from switchboard.shared.flows.catalog import FLOW_STEPS

    for step_name in FLOW_STEPS:
        _register_flow_step(app, step_name, services)

    def _sweep_on_start(sender: Any = None, **_: Any) -> None:
        # Recover what a killed predecessor left behind without waiting for beat.
        try:
            sweep(services())
        except Exception:
            log.exception("startup sweep failed")

    worker_ready.connect(_sweep_on_start, weak=False)


def _register_flow_step(app: Celery, name: str, services: Callable[[], Services]) -> None:
    """One Celery task per flow step, named as the step (readable in Flower)."""
    from switchboard.shared.flows.steps import run_step

    def task(*args: str) -> None:
        run_step(services(), name, *args)

    task.__name__ = name.rsplit(".", 1)[-1]
    task.__doc__ = f"Flow step {name}."
    app.task(name=name, shared=False, **_RETRY)(task)
