"""The registry of flow steps: domain functions the worker runs as named Celery tasks.

A flow module declares ``@flow_step("switchboard.<name>")`` on a function
``(services, *ids) -> None``; the worker registers every step as a task (late ack,
retried on Redis errors). Steps must be idempotent: a step may run twice. A step
enqueued stays pending in Redis until it has run, so one lost with a killed worker is
enqueued again by the sweep (``switchboard.shared.flows.pending``). ``log_ids``
names the step's arguments for its log lines (``("flowId", "turn")``): every line logged
while the step runs carries them, with the step's name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING

import redis

from switchboard.logs import log_context
from switchboard.shared.errors import Unavailable
from switchboard.shared.store import codec
from switchboard.shared.store.sessions import SessionEntry

if TYPE_CHECKING:
    from switchboard.shared.services import Services
    from switchboard.shared.store.runs import RunRecord

log = logging.getLogger("switchboard.flow")

FlowStep = Callable[..., None]

FLOW_STEPS: dict[str, FlowStep] = {}
# Errors after which a step is retried (the worker's task retries them with backoff).
_RETRIED = (Unavailable, redis.ConnectionError, redis.TimeoutError)
# The log field name of each step argument, by step name.
_LOG_IDS: dict[str, tuple[str, ...]] = {}


def flow_step(name: str, *, log_ids: tuple[str, ...] = ()) -> Callable[[FlowStep], FlowStep]:
    """Register a function as the step named ``name``."""

    def register(fn: FlowStep) -> FlowStep:
        if name in FLOW_STEPS and FLOW_STEPS[name] is not fn:
            raise ValueError(f"flow step {name!r} is registered twice")
        FLOW_STEPS[name] = fn
        _LOG_IDS[name] = log_ids
        return fn

    return register


def run_step(services: Services, name: str, *args: str) -> None:
    """Run a registered step (the worker's task body) with its ids bound for logging."""
    from switchboard.shared.flows import pending

    ids = dict(zip(_LOG_IDS.get(name, ()), args, strict=False))
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
    services: Services, name: str, *args: str, following: RunRecord | None = None
) -> None:
    """Run a registered step in the calling task, with its ids bound for logging.

    For a step that was never enqueued (a run's follow-up, run by the task of the run):
    the caller keeps its own record of it until it returns, so no pending entry is kept.
    ``following`` is the run the step follows, as its end step stored it: the step reads
    it from there (`run_of`) instead of the store, and takes the hashes its end step read
    for it (`read_hash`). Errors propagate to the caller."""
    ids = dict(zip(_LOG_IDS.get(name, ()), args, strict=False))
    token = _following.set(following)
    reads = _read_at_end.set(dict(following.read_at_end) if following is not None else None)
    try:
        with log_context(step=name, **ids):
            log.debug("flow step %s (inline)", name)
            FLOW_STEPS[name](services, *args)
    finally:
        _read_at_end.reset(reads)
        _following.reset(token)


# The run whose follow-up step is running inline (see `run_step_inline`).
_following: ContextVar[RunRecord | None] = ContextVar("following", default=None)


def following() -> RunRecord | None:
    """The ended run whose follow-up step is running inline, if any."""
    return _following.get()


# What the followed run's end step read for this step (see `read_hash`); taken once each.
_read_at_end: ContextVar[dict[str, Mapping[str, str]] | None] = ContextVar(
    "read_at_end", default=None
)


def read_hash(services: Services, key: str) -> dict[str, str]:
    """A hash's fields ({} when absent), as a step reads it: the first read of a hash the
    followed run's end step read for it is taken from there (read in the same atomic step
    that ended the run, so as fresh as a read now: the step's writes compare-and-set
    anyway); any later read, or any other hash, comes from the store."""
    reads = _read_at_end.get()
    if reads is not None and key in reads:
        return dict(reads.pop(key))
    return codec.decode_hash(services.store.redis.hgetall(key))


def session_entry(services: Services, session_key: str) -> SessionEntry | None:
    """A session's entry as a step reads it (`read_hash`)."""
    raw = read_hash(services, services.store.ks.session(session_key))
    return SessionEntry.from_hash(session_key, raw) if raw else None


def run_of(services: Services, run_id: str) -> RunRecord | None:
    """The run ``run_id`` as a step reads it: the ended run the step follows when it is
    that one (terminal runs do not change), else from the store."""
    known = _following.get()
    if known is not None and known.run_id == run_id:
        return known
    return services.store.runs.get(run_id)
