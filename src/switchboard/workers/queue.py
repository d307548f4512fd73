"""The TaskQueue the domain enqueues through, backed by Celery's producer pool.

A run enqueued alone is published at once, as a message of its own; runs enqueued from
many threads at once share messages (`GroupCommit`, owned by the queue)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from celery import Celery
from kombu.exceptions import KombuError

from switchboard.shared.errors import BrokerUnavailable
from switchboard.workers.routing import FLOWS_QUEUE, run_queue

# Runs of a batch per message (see `CeleryQueue.enqueue_runs`).
RUNS_PER_MESSAGE = 20
# Under load, a publish of runs waits this long for company (`GroupCommit`): "under load"
# is a publish that ended less than `RUNS_BUSY_WITHIN_S` ago and carried more than one run,
# or company waiting already. Measured with the throughput bench's bursts of sends,
# alternating nine rounds each: messages per send 0.30 -> 0.19, worker CPU per send
# 2.05 -> 1.86 ms, api 0.98 -> 0.89 ms, sends per second 370 -> 403. A send that arrives
# alone is published at once, and so is each send of a caller that sends one at a time (a
# send-and-wait loop, its sends 4 ms apart once a send+wait takes 4 ms): it has no company
# to wait for.
RUNS_LINGER_S = 0.001
RUNS_BUSY_WITHIN_S = 0.004


T = TypeVar("T")


class _Batch(Generic[T]):
    """The items one publish sends, and how it went."""

    __slots__ = ("error", "items", "sent")

    def __init__(self) -> None:
        self.items: list[T] = []
        self.sent = False
        self.error: BaseException | None = None


class GroupCommit(Generic[T]):
    """Items added from many threads go out together: the ones added while a publish is
    under way make the next publish, as a database groups the commits that arrive during
    a disk write. ``add`` returns once its item is published (or raises what publishing
    it raised), so a caller that returns has its message in the broker.

    An item added to an idle publisher goes out at once, alone: nothing waits for company,
    and a lone request costs what it did. Under load a message carries every run that
    arrived during the previous publish, and the worker pays Celery's per-message cost
    (receive, ack, hand to a pool thread) once for all of them.

    ``linger_s``: when the previous publish ended less than ``busy_within_s`` ago and
    carried company of its own (items are coming in side by side, from several callers), a
    publish first waits this long for more. A quiet publisher never lingers, nor does one
    whose items come one at a time: a caller that sends, waits for the answer, then sends
    again (a user's loop) has no company to wait for, however short its gaps."""

    def __init__(
        self,
        publish: Callable[[list[T]], None],
        *,
        linger_s: float = 0.0,
        busy_within_s: float = 0.0,
    ) -> None:
        self._publish = publish
        self._linger_s = linger_s
        self._busy_within_s = busy_within_s
        self._cond = threading.Condition()
        self._open: _Batch[T] = _Batch()
        self._busy = False
        self._last_end = float("-inf")  # monotonic time the last publish ended
        self._last_size = 0  # how many items it carried

    def add(self, item: T) -> None:
        """Publish ``item``, with whatever else is waiting when its turn comes."""
        with self._cond:
            batch = self._open
            batch.items.append(item)
            while self._busy and not batch.sent:
                self._cond.wait()
            if not batch.sent:  # the publisher is idle: this thread publishes the batch
                self._busy = True
                if self._under_load():
                    self._cond.wait(self._linger_s)  # adds meanwhile join this batch
                self._open = _Batch()
        if not batch.sent:
            try:
                self._publish(batch.items)
            except BaseException as exc:
                batch.error = exc
            with self._cond:
                batch.sent = True
                self._busy = False
                self._last_end = time.monotonic()
                self._last_size = len(batch.items)
                self._cond.notify_all()
        if batch.error is not None:
            raise batch.error

    def _under_load(self) -> bool:
        """The last publish ended moments ago and carried company: items arrive side by
        side (called holding the lock)."""
        recent = time.monotonic() - self._last_end < self._busy_within_s
        return recent and (self._last_size > 1 or len(self._open.items) > 1)


@contextlib.contextmanager
def _broker_errors() -> Iterator[None]:
    """The broker library's errors as the domain's `BrokerUnavailable`: kombu's (a broker
    that is down, or a batch publish whose outcome is uncertain, as when Redis fails over
    mid-publish; kombu raises a transport's connection errors as its own), and socket
    errors."""
    try:
        yield
    except (KombuError, OSError) as exc:
        raise BrokerUnavailable(f"{type(exc).__name__}: {exc}") from exc


class CeleryQueue:
    """Sends tasks by name with ids only; results are never stored. A message the broker
    refuses raises `BrokerUnavailable`.

    Runs enqueued at once share messages (`GroupCommit`). The app says whether a publish
    declares its queue first (Celery's default), or not (a Redis broker: the queue is a
    list LPUSH makes)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        # Celery's `declare`: None declares the message's queue, [] declares nothing.
        declares = bool(app.conf.get("switchboard_declare_on_publish", True))
        self._declare: list[Any] | None = None if declares else []
        self.group_commit = GroupCommit(
            self._publish_runs, linger_s=RUNS_LINGER_S, busy_within_s=RUNS_BUSY_WITHIN_S
        )

    def enqueue_run(self, run_id: str, session_key: str) -> None:
        """Execute a run that holds its session lane: a message of its own, or a share of
        one with the runs enqueued from other threads at the same time."""
        with _broker_errors():
            self.group_commit.add((run_id, session_key))

    def _publish_runs(self, runs: list[tuple[str, str]]) -> None:
        if len(runs) == 1:
            self._send("switchboard.run", list(runs[0]), run_queue(runs[0][1]))
        else:
            self.enqueue_runs(runs)

    def enqueue_runs(self, runs: Sequence[tuple[str, str]]) -> None:
        """Execute several runs (a batch spawn), `RUNS_PER_MESSAGE` to a message: a worker
        takes in a thousand sub-agents as fifty messages, not a thousand, and runs each
        message's runs together. The messages go over one broker connection; where kombu
        batches publishes (5.7+), in one pipelined round trip."""
        by_queue: dict[str, list[tuple[str, str]]] = {}
        for run_id, key in runs:
            by_queue.setdefault(run_queue(key), []).append((run_id, key))
        with _broker_errors(), self.app.producer_or_acquire() as producer:
            batch = getattr(producer, "batch", None)
            with batch() if batch is not None else contextlib.nullcontext():
                for queue, queued in by_queue.items():
                    for start in range(0, len(queued), RUNS_PER_MESSAGE):
                        chunk = [list(pair) for pair in queued[start : start + RUNS_PER_MESSAGE]]
                        if len(chunk) == 1:
                            self._send("switchboard.run", chunk[0], queue, producer)
                        else:
                            self._send_many(chunk, queue, producer)

    def _send_many(self, chunk: list[list[str]], queue: str, producer: Any) -> None:
        self.app.send_task(
            "switchboard.runs",
            args=[chunk],
            queue=queue,
            ignore_result=True,
            producer=producer,
            argsrepr=f"[{len(chunk)} runs: {chunk[0][0]}, …]",
            kwargsrepr="{}",
            declare=self._declare,
        )

    def enqueue_resume(self, run_id: str, session_key: str) -> None:
        """Continue a parked run."""
        with _broker_errors():
            self._send("switchboard.resume", [run_id, session_key], run_queue(session_key))

    def enqueue(self, task: str, *args: str, countdown_s: float | None = None) -> None:
        """Any other named follow-up task."""
        with _broker_errors():
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
            declare=self._declare,
        )
