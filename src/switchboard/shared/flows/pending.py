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

from redis import Redis

from switchboard.shared.queue import TaskQueue, take_here
from switchboard.shared.store import codec
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.runs import now_ms
from switchboard.shared.store.scripts import as_text

if TYPE_CHECKING:
    from switchboard.shared.services import Services

# Forget a step that has run, unless it was enqueued again after it started (new score).
# KEYS: pending steps. ARGV: member, score seen when the step started
_DONE = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
"""

# Take the steps presumed lost and push each one's next look ``ARGV[3]`` ms on.
# KEYS: pending steps. ARGV: now ms, limit, recheck ms
_TAKE_LOST = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local later = tonumber(ARGV[1]) + tonumber(ARGV[3])
for _, member in ipairs(due) do redis.call('ZADD', KEYS[1], later, member) end
return due
"""


def step_member(task: str, args: Sequence[str]) -> str:
    """The pending-set member naming one step call: ``["<task>", "<arg>", ...]``."""
    return codec.dumps([task, *args])


def lost_after_ms(lane_lease_s: float) -> int:
    """How long an enqueued step may take to run before it is presumed lost with its
    worker: twice the lane lease (``SWITCHBOARD_LANE_LEASE_S``)."""
    return int(2 * lane_lease_s * 1000)


class PendingStepsQueue:
    """A ``TaskQueue`` that records every flow step it enqueues as pending.

    Runs and resumes pass straight through: their session lane's lease recovers them."""

    def __init__(self, inner: TaskQueue, redis: Redis, ks: Keyspace, lost_after_ms: int) -> None:
        self.inner = inner
        self.redis = redis
        self.key = ks.pending_steps
        self.lost_after_ms = lost_after_ms

    def enqueue_run(self, run_id: str, session_key: str) -> None:
        """Execute a run that holds its session lane (in the current task when it is open
        for it: `RunsTakenHere.collecting`)."""
        if not take_here(run_id, session_key):
            self.inner.enqueue_run(run_id, session_key)

    def enqueue_runs(self, runs: Sequence[tuple[str, str]]) -> None:
        """Execute several runs, each holding its lane."""
        self.inner.enqueue_runs(runs)

    def enqueue_resume(self, run_id: str, session_key: str) -> None:
        """Continue a parked run."""
        self.inner.enqueue_resume(run_id, session_key)

    def enqueue(self, task: str, *args: str, countdown_s: float | None = None) -> None:
        """Record the step as pending (first, so a failed send is still recovered), then
        enqueue it."""
        lost_at = now_ms() + int((countdown_s or 0) * 1000) + self.lost_after_ms
        self.redis.zadd(self.key, {step_member(task, args): lost_at})
        self.inner.enqueue(task, *args, countdown_s=countdown_s)


def pending_score(svc: Services, task: str, args: Sequence[str]) -> int | None:
    """The step's current pending score (read when it starts), or None if untracked."""
    score = svc.store.redis.zscore(svc.store.ks.pending_steps, step_member(task, args))
    return None if score is None else int(score)


def mark_done(svc: Services, task: str, args: Sequence[str], started_score: int | None) -> None:
    """The step has run: forget it, unless it was enqueued again since it started."""
    if started_score is None:
        return
    svc.store.redis.register_script(_DONE)(
        keys=[svc.store.ks.pending_steps], args=[step_member(task, args), started_score]
    )


def enqueue_lost(svc: Services, now: int, limit: int = 500) -> int:
    """Enqueue again every step presumed lost (the sweep); returns how many."""
    recheck_ms = lost_after_ms(svc.settings.lane_lease_s)
    lost = svc.store.redis.register_script(_TAKE_LOST)(
        keys=[svc.store.ks.pending_steps], args=[now, limit, recheck_ms]
    )
    for raw in lost:
        task, *args = codec.loads(as_text(raw))
        svc.queue.enqueue(str(task), *[str(a) for a in args])
    return len(lost)
