"""Running a batch: each line a run of its agent, at most the batch's cap at once.

Admission (`advance`) takes the next lines up to the cap in one script and starts a run
for each, in a session of its own (``agent:<agentId>:batch:<batchId>:<n>``, or the one
its request names), with a follow-up step (`LINE_END`) that writes the line's answer once
and admits the next line, in the worker that ran it: no worker slot waits for anything.
Redis holds which lines were admitted, answered and which run each has, so the sweep
(`sweep_batches`) picks up whatever a dead process left: a line admitted without a run
is started (its idempotency key finds the run if it had one), a lost follow-up step is
re-sent by the outbox, a batch whose last line was answered is ended. A line is answered
once whatever runs twice (`BatchStore.line_done`).
"""

from __future__ import annotations

import logging
import secrets
import time

from switchboard.shared import keys as sk
from switchboard.shared.batches.plans import (
    WINDOW_S,
    LinePlan,
    expired_line,
    output_line,
    refused_line,
)
from switchboard.shared.errors import InvalidInput, SwitchboardError, Unavailable
from switchboard.shared.flows.steps import following, run_of
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.runtime.cancel import cancel_run
from switchboard.shared.services import Services
from switchboard.shared.step_registry import flow_step
from switchboard.shared.store.batches import BatchRecord
from switchboard.shared.store.runs import RunRecord

log = logging.getLogger("switchboard.batch")

LINE_END = "switchboard.batch_line_end"
ADVANCE = "switchboard.batch_advance"
# The run meta naming a line's batch (`batchId` is a spawn batch's).
META_BATCH = "openaiBatchId"
# Lines answered `batch_expired` per round trip.
_PAGE = 500
# A line admitted this long ago with no run recorded lost its start: the sweep starts it.
_START_GRACE_MS = 15_000


def line_session(batch_id: str, index: int, plan: LinePlan) -> str:
    """The session a line runs in: the one its request names, else its own."""
    return plan.session_key or sk.batch_line_key(plan.agent_id, batch_id, index)


def _now_s() -> int:
    return int(time.time())


def advance(svc: Services, batch_id: str) -> int:
    """Admit the batch's next lines up to its cap and start their runs; how many."""
    admitted = svc.store.batches.admit(batch_id)
    start_lines(svc, batch_id, admitted)
    return len(admitted)


def start_lines(svc: Services, batch_id: str, admitted: range) -> None:
    """Start the runs of lines just admitted."""
    if not admitted:
        return
    plans = svc.store.batches.plans(batch_id, admitted.start, len(admitted))
    for index, raw in zip(admitted, plans, strict=True):
        start_line(svc, batch_id, index, LinePlan.loads(raw))


def start_line(svc: Services, batch_id: str, index: int, plan: LinePlan) -> None:
    """Start a line's run (at most one: the idempotency key finds a run started before),
    named on the batch in the same step; a start refused (by send policy) answers the
    line."""
    request = RunRequest(
        session_key=line_session(batch_id, index, plan),
        message=plan.text,
        channel="webchat",
        idempotency_key=f"{batch_id}:{index}",
        extra_system_prompt=plan.extra,
        provenance={"kind": "external_user", "sourceChannel": "batch"},
        kind="batch",
        meta={META_BATCH: batch_id, "batchLine": index},
        on_end={"task": LINE_END, "args": [batch_id, str(index)]},
        link=(svc.store.ks.obatch_runs(batch_id), str(index)),
    )
    try:
        started = start_run(svc, request)
    except Unavailable:
        raise  # the sweep starts it again
    except SwitchboardError as exc:
        status = 403 if exc.kind in ("forbidden", "send_blocked") else 400
        text = refused_line(batch_id, index, plan, status, exc.kind, exc.message)
        answer(svc, batch_id, index, ok=False, text=text, outcome="refused")
        return
    run_id = started.get("runId")
    if not run_id:
        text = refused_line(batch_id, index, plan, 400, "invalid_request", "no run was started")
        answer(svc, batch_id, index, ok=False, text=text, outcome="refused")


def answer(svc: Services, batch_id: str, index: int, *, ok: bool, text: str, outcome: str) -> None:
    """Write a line's answer (once) and start the lines admitted in its place, or end the
    batch."""
    done = svc.store.batches.line_done(batch_id, index, ok=ok, text=text, now_s=_now_s())
    if done.applied:
        svc.metrics.batch_line(outcome)
    if done.finalize:
        finalize(svc, batch_id)
    else:
        start_lines(svc, batch_id, done.admitted)


def finalize(svc: Services, batch_id: str) -> bool:
    """End a batch whose work is over: its output and error lines become its files."""
    rec = svc.store.batches.get(batch_id)
    if rec is None:
        return False
    out_id, err_id = f"file-{secrets.token_hex(12)}", f"file-{secrets.token_hex(12)}"
    ended = svc.store.batches.finalize(rec, out_id, err_id, _now_s())
    if ended:
        log.info("batch %s ended", batch_id, extra={"batchId": batch_id})
    return ended


def _line_run(svc: Services, batch_id: str, index: int) -> RunRecord | None:
    known = following(svc)
    if known is not None and known.meta.get(META_BATCH) == batch_id:
        return known
    run_id = svc.store.batches.run_of(batch_id, index)
    return run_of(svc, run_id) if run_id else None


@flow_step(LINE_END, log_ids=("batchId", "batchLine"))
def line_end(svc: Services, batch_id: str, line: str) -> None:
    """A line's run ended: write its answer to the output or error lines (once) and
    admit the next line."""
    index = int(line)
    run = _line_run(svc, batch_id, index)
    if run is None or not run.terminal:
        raise Unavailable(f"batch {batch_id} line {index}: its run is not named yet")
    raw = svc.store.batches.plan(batch_id, index)
    if raw is None:
        return  # the batch is gone (expired)
    expired = False
    if run.status == "cancelled":
        rec = svc.store.batches.get(batch_id)
        expired = rec is not None and rec.ending == "expired"
    ok, text = output_line(batch_id, index, LinePlan.loads(raw), run, expired=expired)
    outcome = "completed" if ok else ("cancelled" if run.status == "cancelled" else "failed")
    outcome = "expired" if expired else outcome
    answer(svc, batch_id, index, ok=ok, text=text, outcome=outcome)


@flow_step(ADVANCE, log_ids=("batchId",))
def advance_step(svc: Services, batch_id: str) -> None:
    """Start a batch's first lines (enqueued when it is created)."""
    advance(svc, batch_id)


def cancel(svc: Services, batch_id: str) -> str:
    """Stop admitting a batch's lines and cancel its runs in flight; the status after."""
    status, end_now = svc.store.batches.cancel(batch_id, _now_s())
    if end_now:
        finalize(svc, batch_id)
        return "cancelled"
    if status == "cancelling":
        _cancel_in_flight(svc, batch_id)
    return status


def _cancel_in_flight(svc: Services, batch_id: str) -> None:
    run_ids = [r for r in svc.store.batches.in_flight(batch_id).values() if r]
    for run in svc.store.runs.get_many(run_ids):
        if run is not None and not run.terminal:
            cancel_run(svc, run.run_id, run.session_key)


def expire(svc: Services, rec: BatchRecord) -> None:
    """End a batch past its window: admit nothing more, answer each line never admitted
    `batch_expired`, cancel the runs in flight (their lines end `batch_expired` too), and
    end it `expired` once every line is answered. Safe to repeat."""
    batch_id, store = rec.batch_id, svc.store.batches
    if rec.status == "in_progress":
        store.expire(batch_id, _now_s())
    rec = store.get(batch_id) or rec
    if rec.status != "finalizing" or rec.ending != "expired":
        return
    runless = [n for n, run_id in store.in_flight(batch_id).items() if run_id is None]
    pages = [(n, 1) for n in runless] + [
        (first, min(_PAGE, rec.total - first)) for first in range(rec.cursor, rec.total, _PAGE)
    ]
    for first, count in pages:
        plans = store.plans(batch_id, first, count)
        lines = [
            (first + i, expired_line(batch_id, first + i, LinePlan.loads(raw)))
            for i, raw in enumerate(plans)
        ]
        answered = store.answer_many(batch_id, lines, ok=False, now_s=_now_s())
        svc.metrics.batch_line("expired", answered)
    _cancel_in_flight(svc, batch_id)
    finalize(svc, batch_id)


def recover(svc: Services, batch_id: str) -> None:
    """Pick up a batch a dead process left: start its admitted lines that have no run,
    end it if its work is over, admit lines if it has room."""
    rec = svc.store.batches.get(batch_id)
    if rec is None:
        return
    past_window = rec.status == "in_progress" and _now_s() >= rec.created_at + WINDOW_S
    if past_window or rec.ending == "expired":
        expire(svc, rec)
        return
    if rec.status in ("finalizing", "cancelling"):
        if rec.status == "cancelling":
            cancel(svc, batch_id)  # cancels stragglers, ends it once none is in flight
        else:
            finalize(svc, batch_id)
        return
    # A line admitted a while ago without a run: its start was lost with its process (one
    # admitted just now is being started).
    before = int(time.time() * 1000) - _START_GRACE_MS
    for index, run_id in svc.store.batches.in_flight(batch_id, admitted_before_ms=before).items():
        if run_id is None:
            raw = svc.store.batches.plan(batch_id, index)
            if raw is not None:
                start_line(svc, batch_id, index, LinePlan.loads(raw))
    advance(svc, batch_id)


def sweep_batches(svc: Services) -> int:
    """Recover every live batch (the beat's sweep); how many were looked at."""
    live = svc.store.batches.live()
    for batch_id in live:
        try:
            recover(svc, batch_id)
        except (InvalidInput, Unavailable):
            log.warning("batch %s: not recovered this sweep", batch_id, exc_info=True)
    return len(live)
