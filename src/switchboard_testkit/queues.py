"""A TaskQueue for tests that records the runs it is asked to send and nothing else."""

from __future__ import annotations

from collections.abc import Sequence


class RecordingQueue:
    """Keeps the (run id, session key) pairs it is asked to send; any other message
    (a resume, a flow step) is a test failure."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str]] = []

    def enqueue_run(self, run_id: str, session_key: str) -> None:
        self.runs.append((run_id, session_key))

    def enqueue_runs(self, runs: Sequence[tuple[str, str]]) -> None:
        self.runs.extend(runs)

    def enqueue_resume(self, run_id: str, session_key: str) -> None:
        raise AssertionError(f"unexpected resume of {run_id}")

    def enqueue(self, task: str, *args: str, countdown_s: float | None = None) -> None:
        raise AssertionError(f"unexpected task {task}")
