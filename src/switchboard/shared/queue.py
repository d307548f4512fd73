"""The seam between the domain and the task queue: what the domain asks to run next."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from switchboard.shared.store.runs import Claim


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


# The runs a task is open to execute itself (see `RunsTakenHere`).
_taken_here: ContextVar[RunsTakenHere | None] = ContextVar("runs_taken_here", default=None)


class RunsTakenHere:
    """Runs a task executes itself instead of a message each: the runs its follow-up steps
    start (the announce run of a `sessions_send`, the next round of its reply-back loop),
    up to ``limit`` in all.

    Only while `collecting` is open: never a run started during a run (a spawned child, a
    send's target), which must not wait for the run that started it to end. A run taken
    is recorded and holds its lane like any other; only its message is not sent. If the
    worker dies first, the lane's lease lapses and the sweep enqueues it; `release` sends
    what the task did not run (call it in a ``finally``).

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

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Take the runs started in the current context (up to the limit) while open."""
        token = _taken_here.set(self)
        try:
            yield
        finally:
            _taken_here.reset(token)

    def take(self, run_id: str, session_key: str) -> bool:
        if self.taken >= self.limit:
            return False
        self.taken += 1
        self.runs.append((run_id, session_key))
        return True

    def release(self) -> None:
        """Enqueue, as messages, the runs taken and not run (claimed ones queued again)."""
        while self.runs:
            run_id, session_key = self.runs.popleft()
            claim = self.claims.pop(run_id, None)
            if claim is not None and self.requeue is not None:
                self.requeue(run_id, claim.attempt)
            self.queue.enqueue_run(run_id, session_key)


def claim_history() -> int | None:
    """How many messages a run started now should be claimed with, to be taken by the task
    open for it (`RunsTakenHere`); None when no task would take it (no claim then)."""
    state = _taken_here.get()
    if state is None or state.requeue is None or state.taken >= state.limit:
        return None
    return state.history


def take_claimed(run_id: str, session_key: str, claim: Claim) -> bool:
    """Hand a run claimed as it started to the task open to run it (see `claim_history`)."""
    state = _taken_here.get()
    if state is None or not state.take(run_id, session_key):
        return False
    state.claims[run_id] = claim
    return True


def take_here(run_id: str, session_key: str) -> bool:
    """Hand a run to the task open to run it (`RunsTakenHere.collecting`), if it has room."""
    state = _taken_here.get()
    return state is not None and state.take(run_id, session_key)
