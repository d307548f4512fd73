"""The seam between the domain and the task queue: what the domain asks to run next.

`TaskQueue`: every run and step is a message. The rest of this module is the worker's
inline execution, as explicit objects a worker task creates and passes down, never ambient
state: `RunsTakenHere` (runs a task executes itself instead of a message each),
`TakingQueue` (the queue a follow-up step enqueues through, offering each run to the task
first) and `InlineStep` (what a follow-up step run in place knows about the run it
follows).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from switchboard.shared.errors import BrokerUnavailable

if TYPE_CHECKING:
    from switchboard.shared.store.runs import Claim, RunRecord

log = logging.getLogger("switchboard.queue")


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


def enqueue_recorded(enqueue: Callable[[], None], runs: int = 1) -> bool:
    """Queue runs that are recorded already, each holding its lane with a lease (``enqueue``
    sends their messages). A broker that refuses the message loses nothing: the lease
    lapses and the sweep queues the run again, so the caller answers as if it had been
    sent; one WARNING says so. False when it was refused."""
    try:
        enqueue()
    except BrokerUnavailable as exc:
        log.warning(
            "%d run(s) recorded but not queued, the broker refused them (%s): the sweep "
            "queues them once their lane lease lapses",
            runs,
            exc.fields.get("detail", exc),
        )
        return False
    return True


class ForwardingQueue:
    """A `TaskQueue` that hands everything to ``inner``: the base of a queue that changes
    one kind of enqueue and passes the rest on."""

    def __init__(self, inner: TaskQueue) -> None:
        self.inner = inner

    def enqueue_run(self, run_id: str, session_key: str) -> None:
        """Execute a run that holds its session lane."""
        self.inner.enqueue_run(run_id, session_key)

    def enqueue_runs(self, runs: Sequence[tuple[str, str]]) -> None:
        """Execute several runs, each holding its lane."""
        self.inner.enqueue_runs(runs)

    def enqueue_resume(self, run_id: str, session_key: str) -> None:
        """Continue a parked run."""
        self.inner.enqueue_resume(run_id, session_key)

    def enqueue(self, task: str, *args: str, countdown_s: float | None = None) -> None:
        """Any other named follow-up task."""
        self.inner.enqueue(task, *args, countdown_s=countdown_s)


class RunsTakenHere:
    """Runs a worker task executes itself instead of a message each: the runs its
    follow-up steps start (the announce run of a `sessions_send`, the next round of its
    reply-back loop), up to ``limit`` in all.

    Only runs enqueued through a `TakingQueue` made for it are offered, and the task hands
    one only to the follow-up steps it runs: never a run started during a run (a spawned
    child, a send's target), which must not wait for the run that started it to end. A
    run taken is recorded and holds its lane like any other; only its message is not
    sent. If the worker dies first, the lane's lease lapses and the sweep enqueues it;
    `release` sends what the task did not run (call it in a ``finally``).

    A run to be taken here can be claimed in the step that starts it (`claim_history`,
    then `take_claimed`): the task then executes it without a claim step of its own.
    ``requeue(run_id, attempt)`` puts such a run back to queued if it is released unrun."""

    def __init__(
        self,
        queue: TaskQueue,
        limit: int,
        *,
        history: int = 0,
        requeue: Callable[[str, int], object] | None = None,
    ) -> None:
        self.queue = queue
        self.limit = limit
        self.history = history
        self.requeue = requeue
        self.taken = 0
        self.runs: deque[tuple[str, str]] = deque()
        self.claims: dict[str, Claim] = {}

    def take(self, run_id: str, session_key: str) -> bool:
        """Keep the run to execute here, if there is room; False: send it as a message."""
        if self.taken >= self.limit:
            return False
        self.taken += 1
        self.runs.append((run_id, session_key))
        return True

    def claim_history(self) -> int | None:
        """How many messages a run started now should be claimed with, to be taken here;
        None when it would not be taken (no claim then)."""
        if self.requeue is None or self.taken >= self.limit:
            return None
        return self.history

    def take_claimed(self, run_id: str, session_key: str, claim: Claim) -> bool:
        """Keep a run claimed as it started (see `claim_history`), if there is room."""
        if not self.take(run_id, session_key):
            return False
        self.claims[run_id] = claim
        return True

    def release(self) -> None:
        """Enqueue, as messages, the runs taken and not run (claimed ones queued again)."""
        while self.runs:
            run_id, session_key = self.runs.popleft()
            claim = self.claims.pop(run_id, None)
            if claim is not None and self.requeue is not None:
                self.requeue(run_id, claim.attempt)
            self.queue.enqueue_run(run_id, session_key)


class TakingQueue(ForwardingQueue):
    """A `TaskQueue` that offers each single run to a task's `RunsTakenHere` first and
    passes everything else (and the runs it has no room for) to ``inner``. A batch of runs
    is never taken: its runs go out together, as their own message."""

    def __init__(self, inner: TaskQueue, here: RunsTakenHere) -> None:
        super().__init__(inner)
        self.here = here

    def enqueue_run(self, run_id: str, session_key: str) -> None:
        """Execute a run: in the task that holds `here` when it has room, else a message."""
        if not self.here.take(run_id, session_key):
            self.inner.enqueue_run(run_id, session_key)


@dataclass
class InlineStep:
    """A flow step a worker task runs in place, right after the run it follows ended,
    instead of enqueuing it: held by the copy of the services the step is given.

    ``following``: that run, as its end step stored it. ``reads``: the hashes its end
    step read for the step (`RunRecord.read_at_end`), each handed out once (`take_read`).
    ``taken``: the task's `RunsTakenHere`, when it executes the runs the step starts."""

    following: RunRecord | None = None
    reads: dict[str, Mapping[str, str]] = field(default_factory=dict)
    taken: RunsTakenHere | None = None

    def take_read(self, key: str) -> dict[str, str] | None:
        """The hash ``key`` as the followed run's end step read it, the first time only."""
        fields = self.reads.pop(key, None)
        return None if fields is None else dict(fields)

    def claim_history(self) -> int | None:
        """`RunsTakenHere.claim_history` of the task, or None when it takes no runs."""
        return None if self.taken is None else self.taken.claim_history()

    def take_claimed(self, run_id: str, session_key: str, claim: Claim) -> bool:
        """`RunsTakenHere.take_claimed` of the task; False when it takes no runs."""
        return self.taken is not None and self.taken.take_claimed(run_id, session_key, claim)
