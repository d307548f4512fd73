"""The TaskQueue the domain enqueues through, backed by Celery's producer pool."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from celery import Celery

from switchboard.workers.app import FLOWS_QUEUE, RUNS_QUEUE


class CeleryQueue:
    """Sends tasks by name with ids only; results are never stored."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def enqueue_run(self, run_id: str, session_key: str) -> None:
        """Execute a run that holds its session lane."""
        self._send("switchboard.run", [run_id, session_key], RUNS_QUEUE)

    def enqueue_runs(self, runs: Sequence[tuple[str, str]]) -> None:
        """Execute several runs over one broker connection (a batch spawn); where kombu
        batches publishes (5.7+), they go to the broker in one pipelined round trip."""
        with self.app.producer_or_acquire() as producer:
            batch = getattr(producer, "batch", None)
            with batch() if batch is not None else contextlib.nullcontext():
                for run_id, session_key in runs:
                    self._send("switchboard.run", [run_id, session_key], RUNS_QUEUE, producer)

    def enqueue_resume(self, run_id: str, session_key: str) -> None:
        """Continue a parked run."""
        self._send("switchboard.resume", [run_id, session_key], RUNS_QUEUE)

    def enqueue(self, task: str, *args: str, countdown_s: float | None = None) -> None:
        """Any other named follow-up task."""
        self._send(task, list(args), FLOWS_QUEUE, countdown_s=countdown_s)

    def _send(
        self,
        task: str,
        args: list[str],
        queue: str,
        producer: Any = None,
        *,
        countdown_s: float | None = None,
    ) -> None:
        # The args are short ids: their repr is given, sparing Celery's safe repr of them.
        self.app.send_task(
            task,
            args=args,
            queue=queue,
            countdown=countdown_s,
            ignore_result=True,
            producer=producer,
            argsrepr=repr(args),
            kwargsrepr="{}",
        )
