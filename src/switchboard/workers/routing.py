"""The broker queues the worker consumes and which task, and which run, goes to which.

Kept apart from the Celery app so that the app, its tasks and the queue that sends them
all import it and none of them imports another in a circle."""

from __future__ import annotations

from switchboard.shared.keys import is_batch_line_key

RUNS_QUEUE = "sb.runs"
BATCH_QUEUE = "sb.batch"
FLOWS_QUEUE = "sb.flows"
SWEEP_QUEUE = "sb.sweep"
ALL_QUEUES = (RUNS_QUEUE, BATCH_QUEUE, FLOWS_QUEUE, SWEEP_QUEUE)

# Runs and resumes get a queue of their own, so a burst of flow steps never queues ahead
# of them; every other task (the flow steps) goes to the default, `FLOWS_QUEUE`.
TASK_ROUTES = {
    "switchboard.run": {"queue": RUNS_QUEUE},
    "switchboard.runs": {"queue": RUNS_QUEUE},
    "switchboard.resume": {"queue": RUNS_QUEUE},
    "switchboard.sweep": {"queue": SWEEP_QUEUE},
}


def run_queue(session_key: str) -> str:
    """The queue of a run: a batch line's run goes to `BATCH_QUEUE`, so a big batch never
    queues ahead of interactive sends (and a worker pool may consume it alone); every
    other run to `RUNS_QUEUE`."""
    return BATCH_QUEUE if is_batch_line_key(session_key) else RUNS_QUEUE
