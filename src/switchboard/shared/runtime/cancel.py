"""Cancelling runs (`subagents cancel`): a queued or parked run ends now, a running one is
stopped by the worker executing it.

A run that ends here goes on exactly as one its worker ended: the lane's next run starts,
parked waiters resume and its follow-up step (a sub-agent's announce, which tells the
requester it was cancelled) is enqueued. A running run is stamped; the worker's lease
keeper sees the stamp within a second and the executor ends the run as ``cancelled``
(`runtime/cancel_signal.py`); a worker that died meanwhile leaves the stamp on the run,
and the next claim ends it as ``cancelled`` instead of running it.
"""

from __future__ import annotations

import logging

from switchboard.shared.runtime.cancel_signal import CANCELLED_TEXT
from switchboard.shared.runtime.executor import after_run_end
from switchboard.shared.services import Services
from switchboard.shared.store.runs import CancelResult, NewRun, RunRecord

log = logging.getLogger("switchboard.run")


def cancel_run(svc: Services, run_id: str, session_key: str) -> CancelResult:
    """Cancel one run of ``session_key``: 'cancelled' (ended now), 'requested' (its worker
    stops it), 'ended' (it had an outcome already) or 'missing'."""
    res = svc.store.runs.cancel(run_id, session_key, error=CANCELLED_TEXT)
    if res.verdict == "cancelled":
        log.info("run %s cancelled", run_id, extra={"status": "cancelled"})
        svc.metrics.run_ended("cancelled", res.run)
        svc.watch.ended("cancelled", res.run)
        after_run_end(svc, run_id, res.next_run_id, res.waiters, ended=res.run)
    elif res.verdict == "requested":
        log.info("run %s asked to stop (cancel)", run_id)
    return res


def cancel_session_runs(svc: Services, session_key: str) -> dict[str, CancelResult]:
    """Cancel every run of a session that has not ended: the one holding its lane and
    those queued behind it. The session stops waiting for its own children first
    (`RunStore.stop_session`), so their late announces start no run in it."""
    runs = svc.store.runs
    runs.stop_session(session_key)
    out: dict[str, CancelResult] = {}
    # Queued ones first: ending the holder first would hand them the lane to start.
    for run_id in [*runs.lane_queue(session_key), runs.lane_holder(session_key)]:
        if run_id and run_id not in out:
            out[run_id] = cancel_run(svc, run_id, session_key)
    return out


def cancel_paused(svc: Services, yielded: RunRecord) -> CancelResult:
    """Cancel a run that yielded its turn (sessions_yield) and that no run continues yet:
    its continuation is recorded and cancelled at once, never enqueued, carrying the
    yielded run's follow-up (a sub-agent's announce), so the chain ends ``cancelled`` and
    the requester is told (`yield_wake.current_run` follows ``wakeRunId`` to it)."""
    run = NewRun(
        run_id=svc.store.ks.new_id_beside(yielded.session_key),
        session_key=yielded.session_key,
        message=None,
        timeout_s=yielded.timeout_s or 60.0,
        kind=yielded.kind,
        meta={k: v for k, v in yielded.meta.items() if k == "spawnId"},
        on_end=yielded.on_end,
        link=(svc.store.ks.run(yielded.run_id), "wakeRunId"),
    )
    svc.store.runs.start(run)
    return cancel_run(svc, run.run_id, yielded.session_key)
