"""Flower sees each run's life: the worker sends Celery's standard task events for it.

A run's message is acked once the run is claimed (`run_host`): Celery's own events for it
would say SUCCESS in milliseconds whatever the run did. So the run tasks send none
(``send_events=False``) and the worker sends the standard events for each run itself,
the run's id as the task's uuid (a revoke of that id cancels the run, `revokes`):

* ``task-received`` and ``task-started`` as a worker claims it, named
  ``switchboard.run``, its kwargs carrying runId, sessionKey, agentId, label and, for a
  sub-agent, its parent;
* ``task-retried`` before them when a worker takes the run over after its worker was lost;
* as it ends: ``task-succeeded`` with the run's real runtime and a short result (status
  and the start of the reply), ``task-failed`` with its error on one line, or
  ``task-revoked`` when it was cancelled.

Cheap: the run loop only puts the event on a queue; one thread per worker process
publishes what has gathered through one Celery event dispatcher, reused, as one message
(Celery's ``task.multi`` list, which Flower's receiver takes), at most every
`PUBLISH_EVERY_S`: one Redis ``PUBLISH`` per batch, two per run when runs come one at a
time, at most 50 a second under load. An event that cannot be published (the broker
away) is dropped, with a warning.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from celery import Celery

from switchboard.shared import keys as sk
from switchboard.shared.store.runs import Claim, RunRecord

log = logging.getLogger("switchboard.worker")

# The name a run shows under in Flower (the task that carries a run alone).
RUN_TASK = "switchboard.run"
# Events one publish carries at most.
BATCH_MAX = 500
# The least time between two publishes: what comes in meanwhile goes in the next. A run
# alone still shows at once (its first publish waits for nothing); under load a worker
# process publishes at most 50 times a second, whatever its rate of runs. Measured, 300
# runs started back to back on one worker: 503 publishes without it (1.7 a run), 37-42
# with it (0.13 a run); runs more than 20 ms apart: 2 a run.
PUBLISH_EVERY_S = 0.02
# How much of a reply or an error an event carries.
RESULT_CHARS = 120
# How often a publish that keeps failing is logged.
WARN_EVERY_S = 60.0

_Event = tuple[str, dict[str, Any]]


class TaskEvents:
    """A worker process's task events for its runs (a `RunWatch`); ``enabled`` False:
    none (``SWITCHBOARD_TASK_EVENTS=off``)."""

    def __init__(self, app: Celery, *, enabled: bool = True) -> None:
        self.app = app
        self.enabled = enabled
        self.hostname: str | None = None  # the worker's node name, once it is known
        self._queue: queue.SimpleQueue[_Event | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._warned_at = float("-inf")

    def bind(self, hostname: str | None) -> None:
        """Send as the worker ``hostname`` (Flower shows the runs under it)."""
        self.hostname = hostname

    def started(self, run: RunRecord, claim: Claim) -> None:
        """A worker claimed the run: received, retried (taken over from
        a lost worker) and started (now)."""
        if not self.enabled:
            return
        # Stamped now, not when the run was accepted: Celery's event state (Flower's)
        # takes an event stamped far from its arrival for a worker's clock drifting.
        now = time.time()
        self._put(
            "task-received",
            uuid=run.run_id,
            name=RUN_TASK,
            args=repr([run.run_id, run.session_key]),
            kwargs=repr(run_kwargs(run, claim.session)),
            retries=max(0, claim.attempt - 1),
            timestamp=now,
        )
        if not claim.first and claim.attempt > 1:
            self._put(
                "task-retried",
                uuid=run.run_id,
                name=RUN_TASK,
                exception=f"requeued: its worker was lost (attempt {claim.attempt})",
                timestamp=now,
            )
        self._put("task-started", uuid=run.run_id, name=RUN_TASK, timestamp=now)

    def ended(self, status: str, run: RunRecord | None) -> None:
        """The run ended: succeeded, failed or revoked (cancelled), with its runtime."""
        if not self.enabled or run is None:
            return
        fields = end_fields(status, run)
        self._put(fields.pop("type"), **fields)

    def close(self, timeout_s: float = 2.0) -> None:
        """Publish what is queued, then stop the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout_s)

    def _put(self, type_: str, **fields: Any) -> None:
        self._queue.put((type_, fields))
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._serve, name="switchboard-task-events", daemon=True
                    )
                    self._thread.start()

    def _serve(self) -> None:
        """Publish what gathered on the queue, a batch at a time, until `close`."""
        dispatcher: Any = None
        stop = False
        while not stop:
            batch: list[_Event] = []
            item = self._queue.get()
            while item is not None:
                batch.append(item)
                if len(batch) >= BATCH_MAX:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            stop = item is None
            if not batch:
                continue
            try:
                if dispatcher is None:
                    dispatcher = self._dispatcher()
                for type_, fields in batch:
                    dispatcher.send(type_, **fields)
                dispatcher.flush()
            except Exception as exc:  # the broker away: these events are lost, not the runs
                self._warn(exc, len(batch))
                _close(dispatcher)
                dispatcher = None
            if not stop:
                time.sleep(PUBLISH_EVERY_S)  # what comes meanwhile: one publish
        _close(dispatcher)

    def _dispatcher(self) -> Any:
        """One event dispatcher on a broker connection of its own; task events are held
        and sent together on `flush` (Celery's buffered group)."""
        return self.app.events.Dispatcher(
            connection=self.app.connection_for_write(),
            hostname=self.hostname,
            buffer_while_offline=False,
            buffer_group=["task"],
            buffer_limit=BATCH_MAX + 1,
        )

    def _warn(self, exc: Exception, count: int) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning("%d task event(s) for Flower not sent: %s: %s", count, type(exc), exc)


def _close(dispatcher: Any) -> None:
    if dispatcher is None:
        return
    try:
        connection = dispatcher.connection
        dispatcher.close()
        connection.release()
    except Exception:
        log.debug("closing the task event dispatcher failed", exc_info=True)


def run_kwargs(run: RunRecord, session: dict[str, str] | None) -> dict[str, Any]:
    """What Flower shows as a run's kwargs: its ids, label and, for a sub-agent, the
    session that spawned it."""
    session = session or {}
    kwargs: dict[str, Any] = {
        "runId": run.run_id,
        "sessionKey": run.session_key,
        "agentId": sk.agent_id_of(run.session_key),
    }
    label = run.meta.get("label") or session.get("label")
    if label:
        kwargs["label"] = str(label)
    if session.get("spawnedBy"):
        kwargs["parent"] = session["spawnedBy"]
    return kwargs


def end_fields(status: str, run: RunRecord) -> dict[str, Any]:
    """The end event of a run (its ``type`` among the fields)."""
    runtime = None
    if run.started_at_ms is not None and run.ended_at_ms is not None:
        runtime = max(0, run.ended_at_ms - run.started_at_ms) / 1000
    # Stamped by this clock (the run's end time may be the store's): see `started`.
    fields: dict[str, Any] = {"uuid": run.run_id, "name": RUN_TASK, "timestamp": time.time()}
    if runtime is not None:
        fields["runtime"] = runtime
    if status == "ok":
        result = {"status": status, "reply": _short(run.reply or "")}
        return {"type": "task-succeeded", "result": repr(result), **fields}
    if status == "cancelled":
        return {"type": "task-revoked", "terminated": True, "expired": False, **fields}
    error = _short(run.error or status)
    return {"type": "task-failed", "exception": f"{status}: {error}", **fields}


def _short(text: str) -> str:
    """The first line of ``text``, cut to `RESULT_CHARS`."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= RESULT_CHARS else line[: RESULT_CHARS - 1] + "…"


def task_events(app: Celery | None) -> TaskEvents | None:
    """The `TaskEvents` of ``app`` (made by `register_tasks`); None for an app without
    the product's tasks."""
    events = getattr(app, "switchboard_task_events", None)
    return events if isinstance(events, TaskEvents) else None
