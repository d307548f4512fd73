"""Thin Celery tasks: each loads ids, calls into the domain, and lets Redis hold the state.

The worker runs the threads pool, and the runs of a worker process execute as coroutines
on an event loop of its own (`RUN_LOOPS`, one). A pool thread hands a message's runs to a
loop and waits only until each run is claimed (its claim step answered): from then on the
run's state in Redis is all it needs (its lane lease, renewed by the process's lease
keeper; the sweep runs it again if the lease lapses), so the message is acked and the
thread takes the next one while the run goes on. The loops and the runs in flight are
the app's `RunHost`, made with its tasks from ``Settings``: it keeps up to
``worker_max_in_flight`` runs (`handback.InFlight`, 10,000 unless told otherwise) as idle
coroutines waiting on their model; past that its pool threads wait for runs to end, and
Celery takes no more messages meanwhile. Model clients are bound to the loop that opened
them, so a model has a client (and a connection pool) per loop. Deadlines are enforced by
the product (the executor's timeout), not by Celery.

The coroutine that ran a run runs its follow-up step in place, and the runs that step
starts (`_then_follow_up`); a follow-up step enqueued on its own (by the sweep, or a step
not ready yet) is a message of its own. The worker tunes the garbage collector once it is
up (`gc_tune`).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any, Protocol, TypeVar

from celery import Celery
from celery.exceptions import Reject
from celery.signals import worker_init, worker_ready, worker_shutdown, worker_shutting_down

from switchboard.shared import gc_tune
from switchboard.shared.config import Settings
from switchboard.shared.errors import StoreUnavailable, Unavailable
from switchboard.shared.event_loops import new_event_loop
from switchboard.shared.flows.catalog import FLOW_STEPS
from switchboard.shared.flows.steps import run_follow_ups, run_step
from switchboard.shared.flows.sweeper import sweep
from switchboard.shared.metrics import serve
from switchboard.shared.queue import RunsTakenHere
from switchboard.shared.runtime.executor import (
    HISTORY_LIMIT,
    EndsTogether,
    execute_run,
    record_results,
    resume_run,
)
from switchboard.shared.runtime.models import close_clients, preload
from switchboard.shared.runtime.off_loop import off_loop
from switchboard.shared.runtime.together import Together
from switchboard.shared.services import Services
from switchboard.shared.store.runs import Claim, RunRecord
from switchboard.wiring import build_services
from switchboard.workers.handback import (
    DEFAULT_MAX_IN_FLIGHT,
    HANDBACK_TIMEOUT_S,
    InFlight,
    hand_back_runs,
    held_runs,
)
from switchboard.workers.queue import CeleryQueue

log = logging.getLogger("switchboard.worker")

T = TypeVar("T")

# Redis blips (the store raises them as `StoreUnavailable`, an `Unavailable`) are retried
# with backoff; the steps are idempotent.
_RETRY = {
    "autoretry_for": (Unavailable,),
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "max_retries": 20,
}


# The event loops a worker process runs its runs on. One: the process is bound by the GIL,
# and every thread that wants it costs a hand-over of the GIL each time one of them blocks
# and wakes, a futex wait and a context switch in the kernel (a quarter of the worker's CPU
# in a `perf` profile of a 10,000-child fan-out on two loops). Measured alternated on 2
# cores, fast paths on, one loop against two (of 4 or 8 store threads each): the worker's
# CPU per child of a 5,000-child fan-out 5.67-6.08 ms against 6.56-7.25 (10,000:
# 5.47-5.83 against 7.18-7.60 ms, all announced in 60-64 s against 75-81 s);
# fire-and-forget sends 262-284/s against 202-219/s (CPU per 1,000 sends 6.6-7.4 s against
# 8.4-8.6 s); send+wait latency alike (p50 9.6 against 9.7 ms). What would block the loop
# goes to its store threads (`runtime.off_loop`).
RUN_LOOPS = 1
# Threads per run loop for its runs' blocking work: their tool calls, their end and
# follow-up steps (`runtime.off_loop`); that many wait side by side while the loop goes
# on. Idle ones cost nothing: one loop of 2, 4 or 8 measured alike (5.35-6.08 ms per child
# above).
STORE_THREADS_PER_LOOP = 8


class _RunLoops:
    """The worker process's event loops, each on a daemon thread, started on first use.

    Started lazily in the process that uses them, so a forking pool's children each get
    their own (a loop and its thread never survive a fork)."""

    def __init__(self, count: int, new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self._count = count
        self._new_loop = new_loop
        self._lock = threading.Lock()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._pid = 0
        self._next = itertools.count()

    def close(self) -> None:
        """Stop the loops started here (their runs ended or were handed back), and their
        store threads."""
        with self._lock:
            loops, self._loops = self._loops, []
        for loop in loops:
            if not loop.is_closed():
                loop.call_soon_threadsafe(loop.stop)

    def next(self) -> asyncio.AbstractEventLoop:
        """The loop for the next run (round robin)."""
        with self._lock:
            if (
                not self._loops
                or self._pid != os.getpid()
                or any(loop.is_closed() for loop in self._loops)
            ):
                self._loops = [self._start(self._new_loop(), i) for i in range(self._count)]
                self._pid = os.getpid()
            return self._loops[next(self._next) % self._count]

    @staticmethod
    def _start(loop: asyncio.AbstractEventLoop, index: int) -> asyncio.AbstractEventLoop:
        # Where its runs' blocking store work goes (`off_loop`).
        loop.set_default_executor(
            ThreadPoolExecutor(
                STORE_THREADS_PER_LOOP, thread_name_prefix=f"switchboard-store-{index}"
            )
        )
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_forever()  # until `close`
            loop.close()  # its default executor (the store threads) with it

        threading.Thread(target=serve, name=f"switchboard-runs-{index}", daemon=True).start()
        started.wait()
        return loop


# How long a worker that stops without a signal (an embedding's or a test's worker) waits
# for its runs in flight to end.
DRAIN_TIMEOUT_S = 30.0


class RunHost:
    """Where a worker's runs execute: its run loops and its runs in flight (at most
    ``max_in_flight``, handed back to the queue when the worker stops).

    One per Celery app, made with its tasks (`register_tasks`) from ``Settings`` and kept
    on the app (`run_host`), where the tasks and the pool (`workers.pool`) find it."""

    def __init__(
        self,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        loops: int = RUN_LOOPS,
        new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
        waves: Waves | None = None,
    ) -> None:
        self.loops = _RunLoops(loops, new_loop)
        self.in_flight = InFlight(max_in_flight)
        # What the runs that end in the same turn of their loop share (None: nothing).
        self.waves = waves

    def close(self) -> None:
        """Stop the run loops."""
        self.loops.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start a coroutine on one of the run loops (cancelled if the worker stops)."""
        return asyncio.run_coroutine_threadsafe(self.in_flight.track(coro), self.loops.next())

    def hand_over(self, runs: int, body: Callable[[_Claims], Coroutine[Any, Any, None]]) -> None:
        """Start a message's ``runs`` on a run loop (``body`` given their `_Claims`);
        return once each was claimed, so the message is acked while its runs go on.

        Waits first for slots while the host has its limit of runs in flight. A run that
        failed before its claim raises here (the message is retried: the claim is
        idempotent); a failure after it is logged (the run's lease lapses and the sweep
        runs it again). A message taken as the worker stops, or whose runs the stop
        cancelled before their claim, goes back to the queue unrun (`Reject`); claimed ones
        are handed back."""
        in_flight = self.in_flight
        if not in_flight.reserve(runs):
            raise Reject("the worker is stopping", requeue=True)  # for another worker
        claims = _Claims(runs)
        try:
            future = self.submit(body(claims))
        except BaseException:
            in_flight.release(runs)
            raise
        future.add_done_callback(lambda done: self._ended(done, runs, claims))
        claims.all.wait()
        error = claims.error
        if error is None:
            return
        if isinstance(error, CancelledError | asyncio.CancelledError):
            if in_flight.stopping.is_set():
                # Cancelled before its claim: not one of the runs handed back; its message
                # goes back to the queue as it is, for another worker.
                raise Reject("the worker is stopping", requeue=True) from None
            raise CancelledError("the run was cancelled") from None
        raise error

    def _ended(self, done: Future[None], runs: int, claims: _Claims) -> None:
        """A message's coroutine ended (on its loop): its slots go back; a failure is the
        pool thread's if it still waits, else it is logged here."""
        self.in_flight.release(runs)
        error: BaseException | None = CancelledError() if done.cancelled() else done.exception()
        if claims.end(error) or error is None:
            return
        if isinstance(error, CancelledError | asyncio.CancelledError):
            return  # the worker stops: handed back
        if isinstance(error, Unavailable):
            log.warning(
                "run(s) stopped after their claim (%s): the sweep runs them again once "
                "their lane lease lapses",
                error,
            )
            return
        log.error("run(s) failed after their claim", exc_info=error)

    def wait_for_runs(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """As the pool stops: a worker stopped by a signal waits for its hand-back; one
        stopped otherwise (embedded, a test's) waits for its runs in flight to end, as
        Celery's warm shutdown waits for its tasks."""
        in_flight = self.in_flight
        if in_flight.stopping.is_set():
            in_flight.handed_back.wait(HANDBACK_TIMEOUT_S)
        elif not in_flight.wait_idle(timeout_s):
            log.warning("stopping with %d run(s) still in flight", in_flight.taken)


def run_host(app: Celery | None) -> RunHost | None:
    """The `RunHost` of ``app`` (made by `register_tasks`); None for an app without the
    product's tasks."""
    host = getattr(app, "switchboard_run_host", None)
    return host if isinstance(host, RunHost) else None


# How many runs started by a task's follow-up steps (an announce run, a reply-back round)
# the task executes itself; past that they go out as messages, so one task never keeps a
# long chain of rounds to itself.
RUNS_TAKEN_HERE = 4

# A run to execute (`execute_run` or `resume_run` with its ids bound), given where to
# collect the runs it ends that have a follow-up step (None: enqueue those steps).
RunStart = Callable[[list[RunRecord] | None], Awaitable[None]]


class Claimed(Protocol):
    """Told once a run's claim step answered (no error), or that it failed before."""

    def __call__(self, error: BaseException | None = None) -> None: ...


class _Claims:
    """The runs of one message not yet claimed. The pool thread that handed them to a run
    loop waits on `all` (set once each run is claimed or the message's coroutine ended),
    then acks the message, or raises `error` (a run that failed before its claim: the
    message is retried)."""

    def __init__(self, count: int) -> None:
        self._lock = threading.Lock()
        self._left = count
        self.error: BaseException | None = None
        self.all = threading.Event()
        if count <= 0:
            self.all.set()

    def run(self) -> Claimed:
        """The callback of one run: counted once, its first call wins."""
        told = False

        def claimed(error: BaseException | None = None) -> None:
            nonlocal told
            with self._lock:
                if told:
                    return
                told = True
                if error is not None and self.error is None:
                    self.error = error
                self._left -= 1
                if self._left <= 0:
                    self.all.set()

        return claimed

    def end(self, error: BaseException | None) -> bool:
        """The message's coroutine ended: True when its pool thread was still waiting
        (it gets ``error``), False when every run had been claimed already."""
        with self._lock:
            if self.all.is_set():
                return False
            if self.error is None:
                self.error = error
            self.all.set()
            return True


async def _run_and_follow_up(
    svc: Services, start: RunStart, claimed: Claimed, waves: Waves | None = None
) -> None:
    """Execute a run, then its follow-up step right here (`_then_follow_up`, with the
    follow-ups of runs ending at the same time when ``waves`` is given; ``start`` was
    given them for its end step). ``claimed`` is told once the run was claimed (by the
    executor), or as the run ends or fails before that."""
    try:
        await _then_follow_up(svc, start, waves)
    except BaseException as exc:
        claimed(exc)  # nothing if the run was claimed: it went on past its message
        raise
    finally:
        claimed(None)


async def _then_follow_up(svc: Services, start: RunStart, waves: Waves | None = None) -> None:
    """Execute a run (``start``), then its follow-up step right away (off the loop,
    `off_loop`: its store round trips do not hold up the loop's other runs), then the
    runs its follow-up started (up to `RUNS_TAKEN_HERE`), each with its own follow-up;
    the followed runs' outbox entries are cleared together at the end. With
    ``waves``, the end steps of the loop's runs whose results came in in the same turn of
    the loop go in one round trip, and their follow-ups run in one call (`Waves`).

    Handing the ended run back to the pool thread for its follow-up cost a wake-up across
    threads per run: with a batch in flight, the loop running the follow-up measured about
    a tenth faster. A `sessions_send` starts its announce run from its follow-up: executed
    here, it costs no message of its own (two fewer per send, with its announce step)."""
    here = RunsTakenHere(
        svc.queue, RUNS_TAKEN_HERE, history=HISTORY_LIMIT, requeue=svc.store.runs.requeue
    )
    followed: list[str] = []  # runs whose outbox entries are cleared at the end, together
    try:
        ended_runs: list[RunRecord] = []
        await start(ended_runs)
        while True:
            # Only the follow-ups are handed `here`, never a run: a run's own children
            # must not wait for it to end.
            if ended_runs:
                asked = _FollowUps(svc, ended_runs, here, followed)
                if waves is None:
                    followed = (await off_loop(partial(_follow_up_together, [asked])))[0]
                else:
                    followed = await waves.follow_ups(asked)
            if not here.runs:
                return
            run_id, session_key = here.runs[0]
            claim = here.claims.pop(run_id, None)  # claimed as it started: no claim step
            ended_runs = []
            await execute_run(
                svc,
                run_id,
                session_key,
                claim=claim,
                follow_ups=ended_runs,
                ends=waves.ends if waves is not None else None,
            )
            here.runs.popleft()
    finally:
        here.release()
        _clear_outbox(svc, followed)


@dataclass(frozen=True)
class _FollowUps:
    """The ended runs of one `_then_follow_up` whose follow-up steps are to run: where
    the runs their steps start are taken (``here``), and the runs followed up before whose
    outbox entries are still to be cleared."""

    svc: Services
    ended: list[RunRecord]
    here: RunsTakenHere
    followed: list[str]
    # The context it was made in (the run's log fields): its steps run in it.
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


# The follow-ups of the runs of a run loop that end in the same turn of it, run together.
FollowUpsTogether = Together["_FollowUps", list[str]]


@dataclass(frozen=True)
class Waves:
    """What the runs of a loop that end in the same turn of it share (kept by the
    `RunHost`): one round trip for their end steps (`record_results`)
    and one call for their follow-ups (`_follow_up_together`)."""

    ends: EndsTogether
    follow_ups: FollowUpsTogether


def _follow_up_together(asked: list[_FollowUps]) -> list[list[str]]:
    """The follow-up steps of the runs of each ``asked`` (`steps.run_follow_ups`: of a
    step with a form for many, one call for all); answers, per ``asked``, the runs whose
    outbox entries are still to be cleared: its ``followed`` and its ended runs, or none
    once cleared here (when its steps started no run to take in its task, that task ends:
    cleared in the same go)."""
    cleared: dict[int, list[bool]] = {}
    for svc in {id(a.svc): a.svc for a in asked}.values():
        mine = [i for i, a in enumerate(asked) if a.svc is svc]
        flat = [(rec, asked[i].here) for i in mine for rec in asked[i].ended]
        contexts = [asked[i].context for i in mine for _ in asked[i].ended]
        answers = iter(run_follow_ups(svc, flat, contexts))
        for i in mine:
            cleared[i] = [next(answers) for _ in asked[i].ended]
    left_of: list[list[str]] = []
    for i, a in enumerate(asked):
        left = a.followed + [rec.run_id for rec, c in zip(a.ended, cleared[i], strict=True) if c]
        if a.here.runs:
            left_of.append(left)
        else:
            _clear_outbox(a.svc, left)
            left_of.append([])
    return left_of


def _executing(
    svc: Services,
    run_id: str,
    session_key: str,
    claimed: Claimed,
    claim: Claim | str | None = None,
    waves: Waves | None = None,
) -> RunStart:
    """The `RunStart` of a queued run (``claim``: as its message's claims answered)."""
    ends = waves.ends if waves is not None else None
    return lambda follow_ups: execute_run(
        svc,
        run_id,
        session_key,
        claim=claim,
        follow_ups=follow_ups,
        on_claimed=claimed,
        ends=ends,
    )


def _resuming(svc: Services, run_id: str, claimed: Claimed, waves: Waves | None = None) -> RunStart:
    """The `RunStart` of a parked run to continue."""
    ends = waves.ends if waves is not None else None
    return lambda follow_ups: resume_run(
        svc, run_id, follow_ups=follow_ups, on_claimed=claimed, ends=ends
    )


def _clear_outbox(svc: Services, run_ids: list[str]) -> None:
    """Clear followed-up runs from the outbox, in one round trip; if the store is away,
    the sweep finds them there and runs their (idempotent) steps again."""
    if not run_ids:
        return
    try:
        svc.store.runs.outbox_done(*run_ids)
    except StoreUnavailable as exc:
        log.warning(
            "outbox entries of %d run(s) left to the sweep: %s", len(run_ids), exc.__cause__
        )


async def _run_together(
    svc: Services, pairs: list[list[str]], claims: _Claims, waves: Waves | None = None
) -> None:
    """Execute runs side by side on one loop (one hand-over from the pool thread for the
    message, not one per run); if any failed, raise the first failure once all have ended."""
    claimed = [claims.run() for _ in pairs]
    outcomes = await asyncio.gather(
        *(
            _run_and_follow_up(svc, _executing(svc, rid, key, told, waves=waves), told, waves)
            for (rid, key), told in zip(pairs, claimed, strict=True)
        ),
        return_exceptions=True,
    )
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        raise failed


def register_tasks(app: Celery, settings: Settings) -> None:
    """Register every task on ``app``, and make its `RunHost` (``run_host(app)``)."""

    @cache
    def build() -> Services:
        return build_services(settings, queue=CeleryQueue(app))

    def services() -> Services:
        # Tests (and embedders) may hand the app ready-made services.
        override = getattr(app, "services_override", None)
        return override if override is not None else build()

    # uvloop's loops where installed (`event_loops`); the end steps and follow-ups of a
    # wave of runs together (`Waves`).
    waves = Waves(ends=Together(record_results), follow_ups=Together(_follow_up_together))
    host = RunHost(settings.worker_max_in_flight, new_loop=new_event_loop, waves=waves)
    app.switchboard_run_host = host

    @app.task(name="switchboard.run", shared=False, **_RETRY)  # type: ignore[untyped-decorator]
    def run(run_id: str, session_key: str) -> None:
        """Execute one agent run in its session, then its follow-up step if it has one."""
        svc = services()

        def body(claims: _Claims) -> Coroutine[Any, Any, None]:
            claimed = claims.run()
            return _run_and_follow_up(
                svc,
                _executing(svc, run_id, session_key, claimed, waves=host.waves),
                claimed,
                host.waves,
            )

        host.hand_over(1, body)

    @app.task(name="switchboard.runs", shared=False, **_RETRY)  # type: ignore[untyped-decorator]
    def runs(pairs: list[list[str]]) -> None:
        """Execute the runs of one message (a batch, or runs enqueued together) together,
        each in its own session, then each one's follow-up step as it ends."""
        svc = services()
        host.hand_over(
            len(pairs),
            lambda claims: _run_together(svc, pairs, claims, host.waves),
        )

    @app.task(name="switchboard.resume", shared=False, **_RETRY)  # type: ignore[untyped-decorator]
    def resume(run_id: str, session_key: str) -> None:
        """Continue a parked run with the results it waited for, then its follow-up step."""
        svc = services()

        def body(claims: _Claims) -> Coroutine[Any, Any, None]:
            claimed = claims.run()
            return _run_and_follow_up(
                svc, _resuming(svc, run_id, claimed, host.waves), claimed, host.waves
            )

        host.hand_over(1, body)

    @app.task(name="switchboard.sweep", shared=False, **_RETRY)  # type: ignore[untyped-decorator]
    def sweep_task() -> None:
        """Recover expired lanes and overdue parked runs."""
        sweep(services())

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
        if getattr(sender, "app", app) is app:  # this app's worker stopped
            close_clients()
            host.close()

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
