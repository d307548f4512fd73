"""Runs handed to the task whose follow-up started them, and what becomes of the others."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.shared.flows.pending import PendingStepsQueue
from switchboard.shared.queue import InlineStep, RunsTakenHere, TakingQueue
from switchboard_testkit.queues import RecordingQueue

pytestmark = pytest.mark.unit


def queue(inner: RecordingQueue) -> PendingStepsQueue:
    steps: Any = None  # enqueue_run never touches the pending steps
    return PendingStepsQueue(inner, steps, lost_after_ms=1000)


def test_runs_are_taken_up_to_the_limit_and_the_rest_are_sent() -> None:
    """A task takes runs up to its limit; the rest, and those it did not run, are sent."""
    inner = q = RecordingQueue()
    here = RunsTakenHere(q, limit=2)
    taking = TakingQueue(q, here)
    taking.enqueue_run("r1", "k1")
    taking.enqueue_run("r2", "k2")
    taking.enqueue_run("r3", "k3")  # over the limit: a message at once
    assert list(here.runs) == [("r1", "k1"), ("r2", "k2")]
    assert inner.runs == [("r3", "k3")]
    here.runs.popleft()  # the task ran r1, then stopped
    here.release()
    assert inner.runs == [("r3", "k3"), ("r2", "k2")]
    assert not here.runs


def test_only_runs_enqueued_through_the_taking_queue_are_taken() -> None:
    """The plain queue never takes a run, and a batch is never taken even when offered."""
    inner = q = RecordingQueue()
    here = RunsTakenHere(q, limit=4)
    TakingQueue(q, here).enqueue_run("r1", "k1")
    q.enqueue_run("r2", "k2")  # e.g. a child spawned while a taken run executes
    TakingQueue(q, here).enqueue_runs([("r3", "k3")])  # a batch is never taken
    assert list(here.runs) == [("r1", "k1")]
    assert inner.runs == [("r2", "k2"), ("r3", "k3")]


def test_a_failure_after_taking_leaves_the_taken_runs_to_release() -> None:
    """Runs taken before a step failed are sent by `release`."""
    inner = q = RecordingQueue()
    here = RunsTakenHere(q, limit=4)
    with pytest.raises(RuntimeError):
        try:
            TakingQueue(q, here).enqueue_run("r1", "k1")
            raise RuntimeError("the follow-up failed")
        finally:
            here.release()
    assert inner.runs == [("r1", "k1")]


def test_a_run_is_claimed_at_start_only_while_the_task_has_room() -> None:
    """`claim_history` names the history to claim with while there is room, then None;
    a step with no task taking runs never asks for a claim."""
    here = RunsTakenHere(RecordingQueue(), limit=1, history=7, requeue=lambda r, a: None)
    step = InlineStep(taken=here)
    assert step.claim_history() == 7
    assert here.take("r1", "k1")
    assert step.claim_history() is None
    assert InlineStep().claim_history() is None
    assert RunsTakenHere(RecordingQueue(), limit=1).claim_history() is None  # no requeue


def test_a_hash_read_at_the_end_is_handed_out_once() -> None:
    """`InlineStep.take_read` gives each end-step read once, as a copy."""
    step = InlineStep(reads={"k": {"a": "1"}})
    assert step.take_read("k") == {"a": "1"}
    assert step.take_read("k") is None
