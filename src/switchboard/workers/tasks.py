"""Thin Celery tasks: each loads ids, calls into the domain, and lets Redis hold the state.

A run's task hands the run to the worker's `RunHost` (`run_host`) and returns once it is
claimed; the run's follow-up steps run in place after it (`follow_ups`). Flow steps are a
task each, named as the step. The worker tunes the garbage collector once it is up
(`gc_tune`).

The run tasks send no Celery task events: their message ends as the run is claimed, so
the worker sends each run's own (`task_events`). Nor does the sweep: housekeeping every
few seconds would bury the runs in Flower's task list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from functools import cache
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_ready, worker_shutdown, worker_shutting_down

from switchboard.shared import gc_tune
from switchboard.shared.batches.lines import sweep_batches
from switchboard.shared.config import Settings
from switchboard.shared.errors import Unavailable
from switchboard.shared.event_loops import new_event_loop
from switchboard.shared.flows.catalog import FLOW_STEPS
from switchboard.shared.flows.steps import run_step
from switchboard.shared.flows.sweeper import sweep
from switchboard.shared.metrics import serve
from switchboard.shared.runtime.executor import record_results
from switchboard.shared.runtime.models import close_clients, preload
from switchboard.shared.runtime.together import Together
from switchboard.shared.services import Services
from switchboard.wiring import build_services
from switchboard.workers.follow_ups import (
    Waves,
    executing,
    follow_up_together,
    resuming,
    run_and_follow_up,
    run_together,
)
from switchboard.workers.handback import hand_back_runs, held_runs
from switchboard.workers.queue import CeleryQueue
from switchboard.workers.revokes import RevokeWatch
from switchboard.workers.run_host import Claims, RunHost
from switchboard.workers.task_events import TaskEvents

log = logging.getLogger("switchboard.worker")

# Redis blips (the store raises them as `StoreUnavailable`, an `Unavailable`) are retried
# with backoff; the steps are idempotent.
_RETRY = {
    "autoretry_for": (Unavailable,),
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "max_retries": 20,
}


def register_tasks(app: Celery, settings: Settings) -> None:
    """Register every task on ``app``, and make its `RunHost` (``run_host(app)``)."""

    # Each run's life as a task in Flower (`task_events`): sent by the worker itself.
    events = TaskEvents(app, enabled=settings.task_events)
    app.switchboard_task_events = events

    # A revoke of a run's task id (its runId) cancels the run (`revokes`); started and
    # stopped with the worker's pool.
    app.switchboard_revokes = RevokeWatch(lambda: services())

    @cache
    def build() -> Services:
        svc = build_services(settings, queue=CeleryQueue(app))
        svc.watch = events
        return svc

    def services() -> Services:
        # Tests (and embedders) may hand the app ready-made services.
        override = getattr(app, "services_override", None)
        return override if override is not None else build()

    # uvloop's loops where installed (`event_loops`); the end steps and follow-ups of a
    # wave of runs together (`Waves`).
    waves = Waves(ends=Together(record_results), follow_ups=Together(follow_up_together))
    host = RunHost(settings.worker_max_in_flight, new_loop=new_event_loop, waves=waves)
    app.switchboard_run_host = host

    @app.task(name="switchboard.run", shared=False, send_events=False, **_RETRY)  # type: ignore[untyped-decorator]
    def run(run_id: str, session_key: str) -> None:
        """Execute one agent run in its session, then its follow-up step if it has one."""
        svc = services()

        def body(claims: Claims) -> Coroutine[Any, Any, None]:
            claimed = claims.run()
            return run_and_follow_up(
                svc,
                executing(svc, run_id, session_key, claimed, waves=host.waves),
                claimed,
                host.waves,
            )

        host.hand_over(1, body)

    @app.task(name="switchboard.runs", shared=False, send_events=False, **_RETRY)  # type: ignore[untyped-decorator]
    def runs(pairs: list[list[str]]) -> None:
        """Execute the runs of one message (a batch, or runs enqueued together) together,
        each in its own session, then each one's follow-up step as it ends."""
        svc = services()
        host.hand_over(
            len(pairs),
            lambda claims: run_together(svc, pairs, claims, host.waves),
        )

    @app.task(name="switchboard.resume", shared=False, send_events=False, **_RETRY)  # type: ignore[untyped-decorator]
    def resume(run_id: str, session_key: str) -> None:
        """Continue a parked run with the results it waited for, then its follow-up step."""
        svc = services()

        def body(claims: Claims) -> Coroutine[Any, Any, None]:
            claimed = claims.run()
            return run_and_follow_up(
                svc, resuming(svc, run_id, claimed, host.waves), claimed, host.waves
            )

        host.hand_over(1, body)

    @app.task(name="switchboard.sweep", shared=False, send_events=False, **_RETRY)  # type: ignore[untyped-decorator]
    def sweep_task() -> None:
        """Recover expired lanes and overdue parked runs, and the live batches."""
        sweep(services())
        sweep_batches(services())

    for step_name in FLOW_STEPS:
        _register_flow_step(app, step_name, services)

    def _sweep_on_start(sender: Any = None, **_: Any) -> None:
        # Recover what a killed predecessor left behind without waiting for beat.
        try:
            sweep(services())
            sweep_batches(services())
        except Exception:
            log.exception("startup sweep failed")

    def _preload_models(sender: Any = None, **_: Any) -> None:
        # Import the model SDKs the config uses before the first task asks for them.
        try:
            svc = services()
            kinds = preload(svc.config.model_refs(), svc.config.models.providers)
            log.info("model support loaded: %s", ", ".join(kinds))
        except Exception:
            log.exception("loading model support failed; runs load it when they need it")

    def _close_model_clients(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is app:  # this app's worker stopped
            close_clients()
            host.close()
            events.close()

    def _watch_runs(sender: Any = None, **_: Any) -> None:
        # The worker's node name on its runs' task events; services handed to the app
        # (tests, embedders) send them too.
        if getattr(sender, "app", app) is app:
            events.bind(getattr(sender, "hostname", None))
            override = getattr(app, "services_override", None)
            if override is not None:
                override.watch = events

    def _hand_back_on_stop(sender: Any = None, **_: Any) -> None:
        # Sent from the main process's signal handler as a warm (SIGTERM) or cold shutdown
        # starts: the consumer takes no more messages; the runs in flight go back.
        if getattr(app, "services_override", None) is None and build.cache_info().currsize == 0:
            return  # no task ran here: nothing to hand back
        svc = services()
        host.in_flight.stop(lambda lanes: hand_back_runs(svc, lanes), lambda: held_runs(svc))

    def _serve_metrics(sender: Any = None, **_: Any) -> None:
        # The worker's own counters (`shared.metrics`), on the port Prometheus scrapes.
        if settings.metrics_port is not None and getattr(sender, "app", app) is app:
            serve(services().metrics, settings.host, settings.metrics_port)

    def _tune_gc_on_start(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is app:  # this app's worker, not another one's
            gc_tune.tune_gc()

    worker_ready.connect(_tune_gc_on_start, weak=False)
    worker_init.connect(_watch_runs, weak=False)
    worker_init.connect(_preload_models, weak=False)
    worker_shutdown.connect(_close_model_clients, weak=False)
    worker_shutting_down.connect(_hand_back_on_stop, weak=False)
    worker_ready.connect(_sweep_on_start, weak=False)
    worker_ready.connect(_serve_metrics, weak=False)


def _register_flow_step(app: Celery, name: str, services: Callable[[], Services]) -> None:
    """One Celery task per flow step, named as the step (readable in Flower)."""

    def task(*args: str) -> None:
        run_step(services(), name, *args)

    task.__name__ = name.rsplit(".", 1)[-1]
    task.__doc__ = f"Flow step {name}."
    app.task(name=name, shared=False, **_RETRY)(task)
