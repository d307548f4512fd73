"""The TaskQueue the domain enqueues through, backed by Celery's producer pool."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from celery import Celery

from switchboard.workers.app import FLOWS_QUEUE, RUNS_QUEUE

# Runs of a batch per message (see `CeleryQueue.enqueue_runs`).
RUNS_PER_MESSAGE = 20


class CeleryQueue:
    """Sends tasks by name with ids only; results are never stored."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def enqueue_run(self, run_id: str, session_key: str) -> None:
        """Execute a run that holds its session lane."""
        self._send("switchboard.run", [run_id, session_key], RUNS_QUEUE)

    def enqueue_runs(self, runs: Sequence[tuple[str, str]]) -> None:
        """Execute several runs (a batch spawn), `RUNS_PER_MESSAGE` to a message: a worker
        takes in a thousand sub-agents as fifty messages, not a thousand, and runs each
        message's runs together. The messages go over one broker connection; where kombu
        batches publishes (5.7+), in one pipelined round trip."""
        with self.app.producer_or_acquire() as producer:
            batch = getattr(producer, "batch", None)
            with batch() if batch is not None else contextlib.nullcontext():
                for start in range(0, len(runs), RUNS_PER_MESSAGE):
                    chunk = [
                        [run_id, key] for run_id, key in runs[start : start + RUNS_PER_MESSAGE]
                    ]
                    if len(chunk) == 1:
                        self._send("switchboard.run", chunk[0], RUNS_QUEUE, producer)
                    else:
                        self._send_many(chunk, producer)

    def _send_many(self, chunk: list[list[str]], producer: Any) -> None:
        self.app.send_task(
            "switchboard.runs",
            args=[chunk],
            queue=RUNS_QUEUE,
            ignore_result=True,
            producer=producer,
            argsrepr=f"[{len(chunk)} runs: {chunk[0][0]}, …]",
            kwargsrepr="{}",
        )

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
