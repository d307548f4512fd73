"""Thin Celery tasks: each loads ids, calls into the domain, and lets Redis hold the state.

The worker runs the threads pool, and the runs of a worker process execute on a few event
loops of its own (`RUN_LOOPS`): a pool thread hands its run to one and waits for the
outcome. Model clients are bound to the loop that opened them, so a model has a client (and
a connection pool) per loop, not one per pool thread; and a thousand runs waiting on their
model cost a thousand idle coroutines rather than a thousand threads taking turns at the
GIL. One worker process keeps as many runs in flight as it has pool threads. Deadlines are
enforced by the product, not by Celery.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from functools import cache
from typing import Any, TypeVar

import redis
from celery import Celery
from celery.signals import worker_init, worker_ready, worker_shutdown

from switchboard.shared.config import Settings
from switchboard.shared.errors import Unavailable
from switchboard.shared.gc_tune import tune_gc
from switchboard.shared.queue import RunsTakenHere
from switchboard.shared.runtime.executor import (
    HISTORY_LIMIT,
    collect_follow_ups,
    execute_run,
    resume_run,
    run_follow_up,
)
from switchboard.shared.runtime.models import close_clients, preload
from switchboard.shared.runtime.sweeper import sweep
from switchboard.shared.services import Services

log = logging.getLogger("switchboard.worker")

T = TypeVar("T")

# Redis blips are retried with backoff; the steps are idempotent.
_RETRY = {
    "autoretry_for": (Unavailable, redis.ConnectionError, redis.TimeoutError),
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "max_retries": 20,
}


# Runs are spread over a few loops: a run's store calls are short blocking round trips,
# and on one loop each of them would hold up every other run of the process. Two are
# enough: the process is bound by the GIL, and more loops took turns at it for nothing
# (fire-and-forget sends 200-230/s with 8 loops, 220-280/s with 2, in interleaved runs;
# a thousand-child fan-out alike: 6.9 s with 2, 7.0-8.9 s with 8).
RUN_LOOPS = 2


class _RunLoops:
    """The worker process's event loops, each on a daemon thread, started on first use.

    Started lazily in the process that uses them, so a forking pool's children each get
    their own (a loop and its thread never survive a fork)."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._lock = threading.Lock()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._pid = 0
        self._next = itertools.count()

    def next(self) -> asyncio.AbstractEventLoop:
        """The loop for the next run (round robin)."""
        with self._lock:
            if self._pid != os.getpid() or any(loop.is_closed() for loop in self._loops):
                self._loops = [self._start(i) for i in range(self._count)]
                self._pid = os.getpid()
            return self._loops[next(self._next) % self._count]

    @staticmethod
    def _start(index: int) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_forever()

        threading.Thread(target=serve, name=f"switchboard-runs-{index}", daemon=True).start()
        started.wait()
        return loop


_run_loops = _RunLoops(RUN_LOOPS)


def submit(coro: Coroutine[Any, Any, T]) -> Future[T]:
    """Start a coroutine on one of the process's run loops."""
    return asyncio.run_coroutine_threadsafe(coro, _run_loops.next())


# How many runs started by a task's follow-up steps (an announce run, a reply-back round)
# the task executes itself; past that they go out as messages, so one task never keeps a
# long chain of rounds to itself.
RUNS_TAKEN_HERE = 4


async def _then_follow_up(svc: Services, work: Coroutine[Any, Any, None]) -> None:
    """Execute a run (``work``), then its follow-up step right away on the same loop, then
    the runs its follow-up started (up to `RUNS_TAKEN_HERE`), each with its own follow-up.

    Handing the ended run back to the pool thread for its follow-up cost a wake-up across
    threads per run: with a batch in flight, the loop running the follow-up measured about
    a tenth faster. A `sessions_send` starts its announce run from its follow-up: executed
    here, it costs no message of its own (two fewer per send, with its announce step)."""
    here = RunsTakenHere(
        svc.queue, RUNS_TAKEN_HERE, history=HISTORY_LIMIT, requeue=svc.store.runs.requeue
    )
    followed: list[str] = []  # runs whose outbox entries are cleared at the end, together
    try:
        ended_runs = await collect_follow_ups(work)
        while True:
            with here.collecting():  # only the follow-ups' runs, never a run's own
                followed += [ended.run_id for ended in ended_runs if run_follow_up(svc, ended)]
            if not here.runs:
                return
            run_id, session_key = here.runs[0]
            claim = here.claims.pop(run_id, None)  # claimed as it started: no claim step
            ended_runs = await collect_follow_ups(
                execute_run(svc, run_id, session_key, claim=claim)
            )
            here.runs.popleft()
    finally:
        here.release()
        _clear_outbox(svc, followed)


def _clear_outbox(svc: Services, run_ids: list[str]) -> None:
    """Clear followed-up runs from the outbox in one round trip; if the store is away,
    the sweep finds them there and runs their (idempotent) steps again."""
    if not run_ids:
        return
    try:
        svc.store.runs.outbox_done(*run_ids)
    except redis.RedisError as exc:
        log.warning("outbox entries of %d run(s) left to the sweep: %s", len(run_ids), exc)


async def _run_together(svc: Services, pairs: list[list[str]]) -> None:
    """Execute runs side by side on one loop (one hand-over from the pool thread for the
    message, not one per run); if any failed, raise the first failure once all have ended
    (the message is retried; runs that ended are not run again)."""
    outcomes = await asyncio.gather(
        *(_then_follow_up(svc, execute_run(svc, rid, key)) for rid, key in pairs),
        return_exceptions=True,
    )
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        raise failed


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on one of the process's run loops; wait for its outcome here."""
    return submit(coro).result()


def _tune_gc(sender: Any = None, **_: Any) -> None:
    """Once the worker is up: the collector's settings for a busy process (`tune_gc`)."""
    tune_gc()


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
        """Execute one agent run in its session, then its follow-up step if it has one."""
        svc = services()
        run_async(_then_follow_up(svc, execute_run(svc, run_id, session_key)))

    @app.task(name="switchboard.runs", shared=False, **_RETRY)  # type: ignore[untyped-decorator]
    def runs(pairs: list[list[str]]) -> None:
        """Execute the runs of one message (a batch, or runs enqueued together) together,
        each in its own session, then each one's follow-up step as it ends."""
        svc = services()
        run_async(_run_together(svc, pairs))

    @app.task(name="switchboard.resume", shared=False, **_RETRY)  # type: ignore[untyped-decorator]
    def resume(run_id: str, session_key: str) -> None:
        """Continue a parked run with the results it waited for, then its follow-up step."""
        svc = services()
        run_async(_then_follow_up(svc, resume_run(svc, run_id)))

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

    def _preload_models(sender: Any = None, **_: Any) -> None:
        # Import the model SDKs the config uses before the first task asks for them.
        try:
            svc = services()
            kinds = preload(svc.config.model_refs(), svc.config.models.providers)
            log.info("model support loaded: %s", ", ".join(kinds))
        except Exception:
            log.exception("loading model support failed; runs load it when they need it")

    def _close_model_clients(sender: Any = None, **_: Any) -> None:
        close_clients()

    worker_ready.connect(_tune_gc, weak=False)
    worker_init.connect(_preload_models, weak=False)
    worker_shutdown.connect(_close_model_clients, weak=False)
    worker_ready.connect(_sweep_on_start, weak=False)


def _register_flow_step(app: Celery, name: str, services: Callable[[], Services]) -> None:
    """One Celery task per flow step, named as the step (readable in Flower)."""
    from switchboard.shared.flows.steps import run_step

    def task(*args: str) -> None:
        run_step(services(), name, *args)

    task.__name__ = name.rsplit(".", 1)[-1]
    task.__doc__ = f"Flow step {name}."
    app.task(name=name, shared=False, **_RETRY)(task)
