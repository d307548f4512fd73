"""The seam between the domain and the task queue: what the domain asks to run next."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class TaskQueue(Protocol):
    """Enqueues follow-up work. Messages carry ids only; state lives in Redis."""

    def enqueue_run(self, run_id: str, session_key: str) -> None:
        """Execute a run that holds its session lane."""

    def enqueue_runs(self, runs: Sequence[tuple[str, str]]) -> None:
        """Execute several runs, each holding its lane: (run id, session key) pairs."""

    def enqueue_resume(self, run_id: str, session_key: str) -> None:
        """Continue a parked run with the results of the calls it waits on."""

    def enqueue(self, task: str, *args: str, countdown_s: float | None = None) -> None:
        """Any other named follow-up task (flows, announces, deliveries)."""
