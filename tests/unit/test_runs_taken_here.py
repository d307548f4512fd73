"""Runs handed to the task whose follow-up started them, and what becomes of the others."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.shared.flows.pending import PendingStepsQueue
from switchboard.shared.queue import RunsTakenHere, take_here
from switchboard.shared.store.keyspace import Keyspace
from switchboard.testing.queues import RecordingQueue

pytestmark = pytest.mark.unit


def queue(inner: RecordingQueue) -> PendingStepsQueue:
    redis: Any = None  # enqueue_run never touches Redis
    return PendingStepsQueue(inner, redis, Keyspace(), lost_after_ms=1000)


def test_runs_are_taken_up_to_the_limit_and_the_rest_are_sent() -> None:
    inner = RecordingQueue()
    q = queue(inner)
    here = RunsTakenHere(q, limit=2)
    with here.collecting():
        q.enqueue_run("r1", "k1")
        q.enqueue_run("r2", "k2")
        q.enqueue_run("r3", "k3")  # over the limit: a message at once
    assert list(here.runs) == [("r1", "k1"), ("r2", "k2")]
    assert inner.runs == [("r3", "k3")]
    here.runs.popleft()  # the task ran r1, then stopped
    here.release()
    assert inner.runs == [("r3", "k3"), ("r2", "k2")]
    assert not here.runs


def test_only_runs_started_while_collecting_are_taken() -> None:
    inner = RecordingQueue()
    q = queue(inner)
    here = RunsTakenHere(q, limit=4)
    assert not take_here("r0", "k0")  # no task open for it
    with here.collecting():
        q.enqueue_run("r1", "k1")
    q.enqueue_run("r2", "k2")  # e.g. a child spawned while a taken run executes
    with here.collecting():
        q.enqueue_runs([("r3", "k3")])  # a batch is never taken
    assert list(here.runs) == [("r1", "k1")]
    assert inner.runs == [("r2", "k2"), ("r3", "k3")]


def test_a_failure_while_collecting_leaves_the_taken_runs_to_release() -> None:
    inner = RecordingQueue()
    q = queue(inner)
    here = RunsTakenHere(q, limit=4)
    with pytest.raises(RuntimeError):
        try:
            with here.collecting():
                q.enqueue_run("r1", "k1")
                raise RuntimeError("the follow-up failed")
        finally:
            here.release()
    assert inner.runs == [("r1", "k1")]
    assert not take_here("r2", "k2")  # closed again after the failure
