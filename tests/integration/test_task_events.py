"""On a real worker: what a run's task events cost (the Redis commands they add per run),
and a revoke of a run's task id cancelling the run, queued, parked or running."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
from switchboard.shared.store.runs import Claim, RunRecord
from switchboard.workers.task_events import TaskEvents

pytestmark = pytest.mark.integration

RUNS = 20


def _commands(client: redis.Redis) -> dict[str, int]:
    """Calls per command on the server so far."""
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}


def _runs_one_at_a_time(services: Services, key: str) -> None:
    """`RUNS` runs, each started once the one before ended (the quiet case: no batching)."""
    for n in range(RUNS):
        run_id = start_run(services, RunRequest(session_key=key, message=f"hi {n}"))["runId"]
        deadline = time.monotonic() + 20
        record = services.store.runs.get(run_id)
        while record is None or not record.terminal:
            assert time.monotonic() < deadline, record
            time.sleep(0.01)
            record = services.store.runs.get(run_id)
        assert record.status == "ok"


def test_task_events_cost_two_publishes_per_run(
    worker: Any, celery_app: Celery, services: Services, redis_client: redis.Redis
) -> None:
    """Runs that come one at a time cost at most two PUBLISH each for their task events
    (received+started together, then the end), and no other command."""
    events = celery_app.switchboard_task_events  # type: ignore[attr-defined]
    assert isinstance(events, TaskEvents) and services.watch is events
    _runs_one_at_a_time(services, "agent:main:warm")  # connections made, caches warm
    events.enabled = False
    before = _commands(redis_client)
    _runs_one_at_a_time(services, "agent:main:quiet")
    time.sleep(0.5)
    quiet = _commands(redis_client)
    events.enabled = True
    _runs_one_at_a_time(services, "agent:main:watched")
    time.sleep(0.5)  # the last end's event published
    watched = _commands(redis_client)
    off = {c: n - before.get(c, 0) for c, n in quiet.items()}
    on = {c: n - quiet.get(c, 0) for c, n in watched.items()}
    extra = {c: on.get(c, 0) - off.get(c, 0) for c in set(on) | set(off)}
    extra = {c: n for c, n in extra.items() if n and c not in ("info",)}
    publishes = extra.pop("publish", 0)
    assert 0 < publishes <= 2 * RUNS, (publishes, extra)
    # Anything else differs only by noise (a lease renewal more or less), not per run.
    assert all(abs(n) < RUNS // 2 for n in extra.values()), extra


def _ended(services: Services, run_id: str, within_s: float) -> str:
    """The run's status once it ended (failing past ``within_s``)."""
    deadline = time.monotonic() + within_s
    record = services.store.runs.get(run_id)
    while record is None or not record.terminal:
        assert time.monotonic() < deadline, record
        time.sleep(0.05)
        record = services.store.runs.get(run_id)
    return record.status


def _status_becomes(services: Services, run_id: str, status: str) -> None:
    deadline = time.monotonic() + 20
    record = services.store.runs.get(run_id)
    while record is None or record.status != status:
        assert time.monotonic() < deadline, record
        time.sleep(0.05)
        record = services.store.runs.get(run_id)


def test_revoke_ends_a_queued_run_at_once_and_stops_a_running_one(
    worker: Any, celery_app: Celery, services: Services
) -> None:
    """`celery control revoke <runId>` of a run queued behind a busy lane ends it
    `cancelled` at once (the running one goes on), and of the running one stops it."""
    key = "agent:main:revokes"
    running = start_run(services, RunRequest(session_key=key, message="/sleep 30"))["runId"]
    _status_becomes(services, running, "running")
    queued = start_run(services, RunRequest(session_key=key, message="after"))["runId"]
    record = services.store.runs.get(queued)
    assert record is not None and record.status == "queued"
    celery_app.control.revoke(queued)
    assert _ended(services, queued, within_s=5) == "cancelled"
    record = services.store.runs.get(running)
    assert record is not None and record.status == "running"
    celery_app.control.revoke(running)
    assert _ended(services, running, within_s=8) == "cancelled"


def test_revoke_ends_a_parked_run_at_once(
    worker: Any, celery_app: Celery, services: Services
) -> None:
    """A revoke of a run parked on a `sessions_send` wait ends it `cancelled` at once."""
    send = '{"sessionKey": "agent:main:slow", "message": "/sleep 30", "timeoutSeconds": 60}'
    parked = start_run(
        services,
        RunRequest(session_key="agent:main:waiting", message=f"/tool sessions_send {send}"),
    )["runId"]
    _status_becomes(services, parked, "parked")
    celery_app.control.revoke(parked)
    assert _ended(services, parked, within_s=5) == "cancelled"


class _Listener:
    """Celery's own event receiver on the broker, as Flower listens, in a thread."""

    def __init__(self, app: Celery) -> None:
        self.events: list[dict[str, Any]] = []
        self._conn = app.connection_for_read()
        self._receiver = app.events.Receiver(self._conn, handlers={"*": self.events.append})
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()
        time.sleep(0.5)  # subscribed before anything is published

    def _listen(self) -> None:
        with contextlib.suppress(Exception):  # the connection closed as the test ends
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def wait_for(self, found: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first event ``found`` accepts (failing after 20 s)."""
        deadline = time.monotonic() + 20
        while True:
            hit = next((e for e in list(self.events) if found(e)), None)
            if hit is not None:
                return hit
            assert time.monotonic() < deadline, self.events
            time.sleep(0.05)

    def close(self) -> None:
        self._receiver.should_stop = True
        self._conn.release()


@pytest.fixture
def listener(celery_app: Celery) -> Iterator[_Listener]:
    """The task events published on the private broker from now on."""
    watching = _Listener(celery_app)
    yield watching
    watching.close()


def test_a_sub_agents_task_names_its_label_and_parent(
    worker: Any, services: Services, listener: _Listener
) -> None:
    """A sub-agent's run is received as `switchboard.run` with its label and the session
    that spawned it in its kwargs, under the worker's node name."""
    spawn = '{"task": "/reply done", "label": "kid"}'
    start_run(
        services, RunRequest(session_key="agent:main:main", message=f"/tool sessions_spawn {spawn}")
    )
    received = listener.wait_for(
        lambda e: e["type"] == "task-received" and "'label': 'kid'" in e.get("kwargs", "")
    )
    assert received["name"] == "switchboard.run"
    assert "'parent': 'agent:main:main'" in received["kwargs"], received
    assert ":subagent:" in received["kwargs"], received
    assert received["hostname"] == worker.hostname
    listener.wait_for(lambda e: e["type"] == "task-succeeded" and e["uuid"] == received["uuid"])


def test_a_run_taken_over_from_a_lost_worker_is_retried_then_started(
    celery_app: Celery, listener: _Listener
) -> None:
    """A run claimed again after its worker was lost sends task-retried (naming the
    attempt) before task-started."""
    events = celery_app.switchboard_task_events  # type: ignore[attr-defined]
    run = RunRecord(run_id="r-lost", session_key="agent:main:main", status="running")
    events.started(run, Claim(attempt=2, deadline_at_ms=0, run=run, first=False))
    started = listener.wait_for(lambda e: e["type"] == "task-started")
    kinds = [e["type"] for e in listener.events if e.get("uuid") == "r-lost"]
    assert kinds[:3] == ["task-received", "task-retried", "task-started"], kinds
    retried = next(e for e in listener.events if e["type"] == "task-retried")
    assert "worker was lost (attempt 2)" in retried["exception"]
    assert started["uuid"] == "r-lost"
    events.close()
