"""Revoke cancels: a revoke of a run's task id (its runId) cancels the run.

Flower's revoke (``/api/task/revoke/<id>``) and ``celery control revoke <id>`` broadcast
Celery's ``revoke`` control command: each worker adds the ids to its revoked ids
(``celery.worker.state.revoked``) and drops a message with such an id when one comes. A
run's message was acked as the run was claimed (`run_host`), so that alone would stop
nothing. The worker looks at its revoked ids every `POLL_S` (`RevokeWatch`) and cancels
each new one that names a run not ended, through `cancel_run`, the path of ``subagents
cancel``: a queued or parked run ends ``cancelled`` at once, a running one is stopped by
its worker (the lease keeper sees the request within a second), and its follow-up step
(a sub-agent's announce) tells the parent once. Every worker gets the broadcast; the
cancel is idempotent, one of them ends the run. An id that names no run (a flow step's
task) is left to Celery.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from celery import Celery
from celery.worker import state as worker_state

from switchboard.shared.errors import SwitchboardError
from switchboard.shared.runtime.cancel import cancel_run
from switchboard.shared.services import Services

log = logging.getLogger("switchboard.worker")

# How often a worker looks for new revoked ids (an empty set costs a length check).
POLL_S = 0.25


class RevokeWatch:
    """Cancels the runs whose ids a worker's revoked ids gain (started with the worker's
    pool, `workers.pool`)."""

    def __init__(self, services: Callable[[], Services], poll_s: float = POLL_S) -> None:
        self._services = services
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Revoked before this (monotonic, as Celery stamps them): not this worker's to act on.
        self._since = time.monotonic()

    def start(self) -> None:
        """Watch from now on, on a thread of its own."""
        if self._thread is not None:
            return
        self._since = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="switchboard-revokes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(2.0)

    def _serve(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.check()
            except Exception:
                log.exception("cancelling revoked runs failed")

    def check(self) -> list[str]:
        """Cancel the runs revoked since the last look; answers their ids."""
        revoked = worker_state.revoked
        if not revoked:
            return []
        try:
            stamped = revoked.as_dict()  # id -> when it was revoked (monotonic)
        except RuntimeError:  # changed while read (the consumer thread added one): next time
            return []
        new = sorted((at, task_id) for task_id, at in stamped.items() if at > self._since)
        if not new:
            return []
        self._since = new[-1][0]
        return [task_id for _, task_id in new if cancel_revoked(self._services(), task_id)]


def cancel_revoked(svc: Services, task_id: str) -> bool:
    """Cancel the run a revoked task id names, if it has not ended; True when it was
    cancelled or asked to stop here."""
    try:
        run = svc.store.runs.get(task_id)
        if run is None or run.terminal:
            return False
        res = cancel_run(svc, task_id, run.session_key)
    except SwitchboardError as exc:
        log.warning("revoked run %s not cancelled: %s", task_id, exc)
        return False
    log.info("run %s revoked: %s", task_id, res.verdict, extra={"runId": task_id})
    return res.verdict in ("cancelled", "requested")


def revoke_watch(app: Celery | None) -> RevokeWatch | None:
    """The `RevokeWatch` of ``app`` (made by `register_tasks`); None for an app without
    the product's tasks."""
    watch = getattr(app, "switchboard_revokes", None)
    return watch if isinstance(watch, RevokeWatch) else None
