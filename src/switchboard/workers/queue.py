"""The TaskQueue the domain enqueues through, backed by Celery's producer pool."""

from __future__ import annotations

from celery import Celery

from switchboard.workers.app import FLOWS_QUEUE, RUNS_QUEUE


class CeleryQueue:
    """Sends tasks by name with ids only; results are never stored."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def enqueue_run(self, run_id: str, session_key: str) -> None:
        """Execute a run that holds its session lane."""
        self.app.send_task(
            "switchboard.run", args=[run_id, session_key], queue=RUNS_QUEUE, ignore_result=True
        )

    def enqueue_resume(self, run_id: str, session_key: str) -> None:
        """Continue a parked run."""
        self.app.send_task(
            "switchboard.resume", args=[run_id, session_key], queue=RUNS_QUEUE, ignore_result=True
        )

    def enqueue(self, task: str, *args: str, countdown_s: float | None = None) -> None:
        """Any other named follow-up task."""
        self.app.send_task(
            task, args=list(args), queue=FLOWS_QUEUE, countdown=countdown_s, ignore_result=True
        )
