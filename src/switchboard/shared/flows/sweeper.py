"""The periodic sweep that makes the system self-healing.

It recovers lanes whose lease expired (a run whose worker died is queued again, a lost
run message is re-sent, a lane whose holder ended is handed on), resumes parked runs
whose wait deadline passed (and those whose awaited runs ended a while ago: their resume
message was lost), re-sends lost follow-ups and flow steps lost with a killed
worker, enqueues the deliveries that are due (retries, and attempts whose worker died),
archives sub-agent sessions whose time has come, and records when it last ran. Every
action is idempotent, so a sweep that runs twice, late, or on two beat instances at once
does no harm.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from switchboard.shared.delivery import enqueue_due
from switchboard.shared.flows.pending import enqueue_lost
from switchboard.shared.flows.subagent_archive import sweep_archive
from switchboard.shared.runtime.executor import enqueue_follow_up
from switchboard.shared.services import Services
from switchboard.shared.store.runs import ParkedCall, now_ms

log = logging.getLogger("switchboard.sweep")

# A parked run that was resumed for its deadline is looked at again after this long.
_PARKED_RECHECK_MS = 10_000
# A parked run whose awaited runs ended this long ago and is still parked is resumed
# again (its resume message was lost); at most this many parked runs are looked at.
_RESUME_GRACE_MS = 10_000
_ANSWERED_SCAN = 500
# An ended run's follow-up not confirmed enqueued within this long is enqueued again.
_OUTBOX_GRACE_MS = 15_000


@dataclass
class SweepReport:
    """What one sweep did (for logs and tests)."""

    requeued: int = 0
    resent: int = 0
    released: int = 0
    resumed: int = 0
    followups: int = 0
    deliveries: int = 0
    lost_steps: int = 0
    extended: int = 0


def sweep(svc: Services) -> SweepReport:
    """Run every recovery step once."""
    report = SweepReport()
    now = now_ms()
    last = svc.store.sweeps.last_ran("sweep")
    # Nothing was swept for longer than a lease (the store was unreachable, or no beat
    # ran): the leases that lapsed meanwhile say nothing of whether their workers live.
    # Those workers renew within a third of a lease once they reach the store again, so
    # a running run whose lease lapsed gets one more lease before it is run again.
    stalled = last is not None and now - last > svc.store.runs.lease_s * 1000
    _sweep_lanes(svc, now, report, stalled=stalled)
    _sweep_parked(svc, now, report)
    _sweep_answered(svc, now, report)
    _sweep_outbox(svc, now, report)
    report.deliveries = enqueue_due(svc, now)
    report.lost_steps = enqueue_lost(svc, now)
    sweep_archive(svc, now)
    svc.store.sweeps.mark_ran("sweep", now)
    # Only a sweep that did something is logged: an idle stack writes nothing at INFO.
    done = {name: count for name, count in vars(report).items() if count}
    if done:
        log.info("sweep recovered %s", ", ".join(f"{n}={c}" for n, c in done.items()))
    return report


def _sweep_lanes(svc: Services, now: int, report: SweepReport, *, stalled: bool) -> None:
    runs = svc.store.runs
    for session_key in runs.expired_leases(now):
        holder = runs.lane_holder(session_key)
        if holder is None:
            svc.store.sweeps.drop_lease(session_key)
            continue
        rec = runs.get(holder)
        if rec is None or rec.terminal:
            nxt = runs.release_lane(session_key, holder)
            report.released += 1
            if nxt:
                svc.queue.enqueue_run(nxt, session_key)
            continue
        if rec.status == "parked":
            runs.push_lease(session_key, now + runs.lease_s * 1000)
            continue
        if rec.status == "running" and stalled:
            runs.push_lease(session_key, now + runs.lease_s * 1000)
            report.extended += 1
            continue
        if rec.status == "running":
            # The worker stopped renewing the lease: it died. Run it again (the attempt
            # counter in the run record caps how often). Only if the lease is still
            # lapsed: a sweep running beside this one may have requeued it and a worker
            # claimed it again since the leases were read.
            verdict = runs.requeue(holder, lapsed=(session_key, now))
            if verdict == "parked":  # it had been resumed: resumed again, not rerun
                runs.push_lease(session_key, now + runs.lease_s * 1000)
                svc.queue.enqueue_resume(holder, session_key)
                report.requeued += 1
                continue
            if verdict != "queued":
                continue
            report.requeued += 1
        else:
            report.resent += 1
        runs.push_lease(session_key, now + runs.lease_s * 1000)
        svc.queue.enqueue_run(holder, session_key)


def _sweep_answered(svc: Services, now: int, report: SweepReport) -> None:
    """Resume the parked runs whose awaited runs all ended a while ago, before their
    deadline: their resume message was lost (a worker that died had taken it). A resume
    is idempotent, and one whose message is merely late finds nothing left to do."""
    runs = svc.store.runs
    parked = [r for r in runs.get_many(runs.parked(_ANSWERED_SCAN)) if r and r.status == "parked"]
    calls = {r.run_id: [ParkedCall.from_json(c) for c in r.parked] for r in parked}
    ids = sorted({t for cs in calls.values() for c in cs for t in c.target_run_ids})
    if not ids:
        return
    before = now - _RESUME_GRACE_MS
    ended = {
        run_id
        for run_id, target in zip(ids, runs.get_many(ids), strict=True)
        if target is None or (target.terminal and (target.ended_at_ms or 0) <= before)
    }
    for rec in parked:
        waits = calls[rec.run_id]
        if waits and all(any(t in ended for t in c.target_run_ids) for c in waits):
            svc.queue.enqueue_resume(rec.run_id, rec.session_key)
            report.resumed += 1


def _sweep_parked(svc: Services, now: int, report: SweepReport) -> None:
    runs = svc.store.runs
    for run_id in runs.overdue_parked(now):
        rec = runs.get(run_id)
        if rec is None or rec.status != "parked":
            svc.store.sweeps.drop_parked(run_id)
            continue
        runs.push_parked(run_id, now + _PARKED_RECHECK_MS)
        svc.queue.enqueue_resume(run_id, rec.session_key)
        report.resumed += 1


def _sweep_outbox(svc: Services, now: int, report: SweepReport) -> None:
    """Re-enqueue follow-up steps of ended runs that were never confirmed enqueued."""
    runs = svc.store.runs
    for run_id in runs.outbox_due(now - _OUTBOX_GRACE_MS):
        rec = runs.get(run_id)
        if rec is None or not rec.on_end:
            runs.outbox_done(run_id)
            continue
        runs.outbox_retry_later(run_id, now)
        enqueue_follow_up(svc, rec)
        report.followups += 1
