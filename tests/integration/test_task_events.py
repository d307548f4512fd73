"""On a real worker: what a run's task events cost (the Redis commands they add per run),
and a revoke of a run's task id cancelling the run, queued, parked or running."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from celery import Celery

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
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
