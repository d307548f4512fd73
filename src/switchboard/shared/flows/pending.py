"""Pending flow steps: a step enqueued is tracked in Redis until it has run.

The broker alone does not make a step durable: a worker that is killed holding a step
(executing it, or keeping a countdown message until its time) gives it back only after
the broker's visibility timeout (2 h). So every ``enqueue`` of a flow step also records
the step in ``Keyspace.pending_steps``, scored by when it is presumed lost (its countdown
plus ``lost_after_ms``); ``run_step`` removes it once the step has run (unless the step
was enqueued again meanwhile), and the sweep enqueues again every step still pending at
its score (``enqueue_lost``). Steps are idempotent, so a step presumed lost that was
only slow runs twice and the second run does nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from switchboard.shared.queue import ForwardingQueue, TaskQueue
from switchboard.shared.store import codec
from switchboard.shared.store.pending import PendingStepStore
from switchboard.shared.store.runs import now_ms

if TYPE_CHECKING:
    from switchboard.shared.services import Services


def step_member(task: str, args: Sequence[str]) -> str:
    """The pending-set member naming one step call: ``["<task>", "<arg>", ...]``."""
    return codec.dumps([task, *args])


def lost_after_ms(lane_lease_s: float) -> int:
    """How long an enqueued step may take to run before it is presumed lost with its
    worker: twice the lane lease (``SWITCHBOARD_LANE_LEASE_S``)."""
    return int(2 * lane_lease_s * 1000)


class PendingStepsQueue(ForwardingQueue):
    """A ``TaskQueue`` that records every flow step it enqueues as pending.

    Runs and resumes pass straight through: their session lane's lease recovers them."""

    def __init__(self, inner: TaskQueue, steps: PendingStepStore, lost_after_ms: int) -> None:
        super().__init__(inner)
        self.steps = steps
        self.lost_after_ms = lost_after_ms

    def enqueue(self, task: str, *args: str, countdown_s: float | None = None) -> None:
        """Record the step as pending (first, so a failed send is still recovered), then
        enqueue it."""
        lost_at = now_ms() + int((countdown_s or 0) * 1000) + self.lost_after_ms
        self.steps.add(step_member(task, args), lost_at)
        self.inner.enqueue(task, *args, countdown_s=countdown_s)


def pending_score(svc: Services, task: str, args: Sequence[str]) -> int | None:
    """The step's current pending score (read when it starts), or None if untracked."""
    return svc.store.pending.score(step_member(task, args))


def mark_done(svc: Services, task: str, args: Sequence[str], started_score: int | None) -> None:
    """The step has run: forget it, unless it was enqueued again since it started."""
    if started_score is None:
        return
    svc.store.pending.done(step_member(task, args), started_score)


def enqueue_lost(svc: Services, now: int, limit: int = 500) -> int:
    """Enqueue again every step presumed lost (the sweep); returns how many."""
    recheck_ms = lost_after_ms(svc.settings.lane_lease_s)
    lost = svc.store.pending.take_lost(now, recheck_ms, limit)
    for member in lost:
        task, *args = codec.loads(member)
        svc.queue.enqueue(str(task), *[str(a) for a in args])
    return len(lost)
