"""Running flow steps: domain functions the worker runs as named Celery tasks.

A module declares its steps with ``@flow_step("switchboard.<name>")``
(`switchboard.shared.step_registry`); the worker registers every step as a task (late
ack, retried on Redis errors). Steps must be idempotent: a step may run twice. A step
enqueued stays pending in Redis until it has run, so one lost with a killed worker is
enqueued again by the sweep (``switchboard.shared.flows.pending``). Every line logged
while a step runs carries its ``log_ids`` fields, with the step's name.

The runs that end together on a worker's loop have their follow-up steps run through a
step's form for many (``@together_step(name)``) where it has one (`run_follow_ups`), so
their round trips to the store are shared.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from switchboard import telemetry
from switchboard.logs import log_context
from switchboard.shared.errors import StoreUnavailable, Unavailable
from switchboard.shared.queue import InlineStep, RunsTakenHere, TakingQueue
from switchboard.shared.step_registry import FLOW_STEPS, FLOW_STEPS_TOGETHER, log_fields
from switchboard.shared.store.sessions import SessionEntry

if TYPE_CHECKING:
    from switchboard.shared.services import Services
    from switchboard.shared.store.runs import RunRecord

log = logging.getLogger("switchboard.flow")

# Errors after which a step is retried (the worker's task retries them with backoff); the
# store raises Redis failures as `StoreUnavailable`, an `Unavailable`.
_RETRIED = (Unavailable,)


def run_step(services: Services, name: str, *args: str) -> None:
    """Run a registered step (the worker's task body) with its ids bound for logging."""
    from switchboard.shared.flows import pending

    ids = log_fields(name, args)
    started = pending.pending_score(services, name, args)
    with log_context(step=name, **ids):
        log.debug("flow step %s", name)
        try:
            FLOW_STEPS[name](services, *args)
        except _RETRIED:
            raise  # still pending: the task's retry or the sweep runs it again
        except Exception:
            pending.mark_done(services, name, args, started)  # a failure is not retried
            raise
    pending.mark_done(services, name, args, started)


def run_step_inline(
    services: Services,
    name: str,
    *args: str,
    following: RunRecord | None = None,
    taken: RunsTakenHere | None = None,
) -> None:
    """Run a registered step in the calling task, with its ids bound for logging.

    For a step that was never enqueued (a run's follow-up, run by the task of the run):
    the caller keeps its own record of it until it returns, so no pending entry is kept.
    ``following`` is the run the step follows, as its end step stored it: the step reads
    it from there (`run_of`) instead of the store, and takes the hashes its end step read
    for it (`read_hash`). ``taken``: the task executes the runs the step starts, as far
    as it has room (`RunsTakenHere`). Errors propagate to the caller."""
    ids = log_fields(name, args)
    with log_context(step=name, **ids):
        log.debug("flow step %s (inline)", name)
        FLOW_STEPS[name](inline_services(services, following=following, taken=taken), *args)


def inline_services(
    services: Services, *, following: RunRecord | None = None, taken: RunsTakenHere | None = None
) -> Services:
    """The copy of ``services`` a step run in place is given: it knows the run it follows
    (`InlineStep`), and its queue offers the runs it starts to ``taken`` first."""
    reads = dict(following.read_at_end) if following is not None else {}
    queue = services.queue if taken is None else TakingQueue(services.queue, taken)
    step = InlineStep(following=following, reads=reads, taken=taken)
    return replace(services, queue=queue, inline=step)


def run_follow_up(svc: Services, rec: RunRecord, taken: RunsTakenHere | None = None) -> bool:
    """Run an ended run's `onEnd` step here and now; True when its outbox entry is to be
    cleared (`RunStore.outbox_done`, which the caller does for all the runs it followed
    up at once), False when the step is left to the sweep.

    Until it is cleared the outbox holds it: if this worker dies first, or the store is
    away, the sweep enqueues the step (steps are idempotent)."""
    task, args = _on_end(rec)
    try:
        with telemetry.resumed(rec.traceparent):  # the step's runs join the run's trace
            run_step_inline(svc, task, *args, following=rec, taken=taken)
    except Exception as exc:
        return _after_follow_up(svc, rec, exc)
    return True


def run_follow_ups(
    svc: Services,
    ended: Sequence[tuple[RunRecord, RunsTakenHere | None]],
    contexts: Sequence[contextvars.Context] | None = None,
) -> list[bool]:
    """The `onEnd` steps of runs that ended together, each with where the runs it starts
    are taken (`run_follow_up`'s ``taken``): the steps of one name that has a form for
    many (`together_step`) run in one call, the rest one by one, each in its run's
    context when ``contexts`` gives them (one per run: its log fields). Answers, per run,
    what `run_follow_up` does. With tracing on, each step runs on its own in its run's
    trace."""
    cleared = [True] * len(ended)
    together: dict[str, list[int]] = {}
    for i, (rec, taken) in enumerate(ended):
        task, _ = _on_end(rec)
        if task in FLOW_STEPS_TOGETHER and len(ended) > 1 and not telemetry.tracing():
            together.setdefault(task, []).append(i)
        elif contexts is not None:
            cleared[i] = contexts[i].run(run_follow_up, svc, rec, taken)
        else:
            cleared[i] = run_follow_up(svc, rec, taken)
    for task, members in together.items():
        steps = [
            (
                inline_services(svc, following=ended[i][0], taken=ended[i][1]),
                _on_end(ended[i][0])[1],
            )
            for i in members
        ]
        with log_context(step=task, together=len(steps)):
            log.debug("flow step %s (inline, %d together)", task, len(steps))
            failures = FLOW_STEPS_TOGETHER[task](steps)
        for i, failure in zip(members, failures, strict=True):
            if failure is not None:
                cleared[i] = _after_follow_up(svc, ended[i][0], failure)
    return cleared


def _on_end(rec: RunRecord) -> tuple[str, list[str]]:
    assert rec.on_end is not None
    return str(rec.on_end["task"]), [str(a) for a in rec.on_end.get("args", [])]


def _after_follow_up(svc: Services, rec: RunRecord, failure: BaseException) -> bool:
    """A run's follow-up step failed: left to the sweep when the store is away (False),
    enqueued when it is not ready yet (retried with backoff), else logged."""
    task, args = _on_end(rec)
    if isinstance(failure, StoreUnavailable):
        log.warning("run %s: its follow-up %s is left to the sweep", rec.run_id, task)
        return False
    if isinstance(failure, Unavailable):  # not ready yet: a task of its own
        svc.queue.enqueue(task, *args)
    elif isinstance(failure, Exception):
        log.error("run %s: its follow-up %s failed", rec.run_id, task, exc_info=failure)
    else:
        raise failure  # not an error to handle here (a cancellation, an exit)
    return True


def following(services: Services) -> RunRecord | None:
    """The ended run whose follow-up step is running inline with ``services``, if any."""
    return services.inline.following if services.inline is not None else None


def read_hash(services: Services, key: str) -> dict[str, str]:
    """A hash's fields ({} when absent), as a step reads it: the first read of a hash the
    followed run's end step read for it is taken from there (read in the same atomic step
    that ended the run, so as fresh as a read now: the step's writes compare-and-set
    anyway); any later read, or any other hash, comes from the store."""
    fields = read_at_end(services, key)
    return fields if fields is not None else services.store.flows.read_hash(key)


def read_at_end(services: Services, key: str) -> dict[str, str] | None:
    """A hash as the followed run's end step read it for the step (the first time only),
    else None: the caller reads it itself (`read_hash`, or with its other reads)."""
    return services.inline.take_read(key) if services.inline is not None else None


def session_entry(services: Services, session_key: str) -> SessionEntry | None:
    """A session's entry as a step reads it (`read_hash`)."""
    raw = read_hash(services, services.store.ks.session(session_key))
    return SessionEntry.from_hash(session_key, raw) if raw else None


def run_of(services: Services, run_id: str) -> RunRecord | None:
    """The run ``run_id`` as a step reads it: the ended run the step follows when it is
    that one (terminal runs do not change), else from the store."""
    known = following(services)
    if known is not None and known.run_id == run_id:
        return known
    return services.store.runs.get(run_id)
