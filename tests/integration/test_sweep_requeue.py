"""Two sweeps side by side (beat's and a starting worker's) requeue a run whose lease
lapsed once: the second finds the lease pushed on (the first requeued it, a worker claimed
it again) and leaves the new attempt running."""

from __future__ import annotations

import dataclasses

import pytest

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
from switchboard.shared.store.runs import ParkedCall, now_ms
from switchboard_testkit.queues import RecordingQueue

pytestmark = pytest.mark.integration


def test_a_run_claimed_again_since_its_lease_lapsed_is_not_requeued(services: Services) -> None:
    svc = dataclasses.replace(services, queue=RecordingQueue())
    runs = svc.store.runs
    key = "agent:main:hook:two-sweeps"
    run_id = start_run(svc, RunRequest(session_key=key, message="hi"))["runId"]
    assert not isinstance(runs.claim(run_id, key), str)
    lapsed_at = now_ms()  # both sweeps saw the lease lapsed at this time
    runs.push_lease(key, lapsed_at - 1000)

    # The first sweep requeues it and pushes the lease; a worker claims attempt 2.
    assert runs.requeue(run_id, lapsed=(key, lapsed_at)) == "queued"
    runs.push_lease(key, lapsed_at + runs.lease_s * 1000)
    claimed = runs.claim(run_id, key)
    assert not isinstance(claimed, str), claimed
    assert claimed.attempt == 2

    # The second sweep, from the same lapsed picture: the new attempt keeps running.
    assert runs.requeue(run_id, lapsed=(key, lapsed_at)) == "renewed"
    assert runs.status(run_id) == "running"
    assert runs.get(run_id).attempt == 2  # type: ignore[union-attr]
    # Without the lease check (a hand-back of a run this process holds) it is requeued.
    assert runs.requeue(run_id) == "queued"


def test_a_second_sweep_between_requeue_and_lease_push_requeues_nothing(
    services: Services,
) -> None:
    """Two sweeps a few ms apart from the same lapsed picture: the first requeued the run
    but has not pushed its lease yet; the second is told 'not-running' (not 'queued', which
    would make it count the run as requeued and enqueue it a second time)."""
    svc = dataclasses.replace(services, queue=RecordingQueue())
    runs = svc.store.runs
    key = "agent:main:hook:sweeps-8ms-apart"
    run_id = start_run(svc, RunRequest(session_key=key, message="hi"))["runId"]
    assert not isinstance(runs.claim(run_id, key), str)
    lapsed_at = now_ms()
    runs.push_lease(key, lapsed_at - 1000)
    assert runs.requeue(run_id, lapsed=(key, lapsed_at)) == "queued"  # the first sweep
    assert runs.requeue(run_id, lapsed=(key, lapsed_at)) == "not-running"  # the second
    assert runs.requeue(run_id) == "not-running"  # a hand-back too
    assert runs.status(run_id) == "queued"


def test_a_resumed_run_whose_worker_vanished_is_parked_again_for_its_resume(
    services: Services,
) -> None:
    """Resumed, then lost: back to parked (its turn is not run again from its start),
    a try counted; once past runs.maxAttempts tries its resume ends it lost."""
    svc = dataclasses.replace(services, queue=RecordingQueue())
    runs = svc.store.runs
    key = "agent:main:hook:resumed-lost"
    target = start_run(svc, RunRequest(session_key="agent:main:hook:target", message="t"))
    run_id = start_run(svc, RunRequest(session_key=key, message="hi"))["runId"]
    claimed = runs.claim(run_id, key)
    assert not isinstance(claimed, str), claimed
    call = ParkedCall(
        tool_call_id="call-1",
        tool_name="sessions_send",
        target_run_id=target["runId"],
        deadline_ms=now_ms() + 60_000,
    )
    assert runs.park(run_id, key, claimed.attempt, calls=[call], messages=[]) == "parked"
    for lost in range(1, runs.max_attempts + 1):
        resumed = runs.resume(run_id, key)
        assert not isinstance(resumed, str), resumed
        assert not resumed.exhausted, lost
        assert runs.requeue(run_id, lapsed=(key, now_ms() + runs.lease_s * 1000)) == "parked"
        assert runs.status(run_id) == "parked"
        assert run_id in runs.overdue_parked(now_ms() + 1)
    # One try was the claim; each loss of a resumed run is one more: none left.
    resumed = runs.resume(run_id, key)
    assert not isinstance(resumed, str) and resumed.exhausted


class _Resumes(RecordingQueue):
    """Records the resumes it is asked to send too."""

    def __init__(self) -> None:
        super().__init__()
        self.resumes: list[tuple[str, str]] = []

    def enqueue_resume(self, run_id: str, session_key: str) -> None:
        self.resumes.append((run_id, session_key))


def test_a_parked_run_whose_awaited_run_ended_a_while_ago_is_resumed_before_its_deadline(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its resume message was lost (a killed worker had taken it): the sweep resumes it
    once its run has been ended for `_RESUME_GRACE_MS`, not at its deadline; while its
    run has not ended, or ended just now (its own resume is on its way), not."""
    from switchboard.shared.flows import sweeper

    queue = _Resumes()
    svc = dataclasses.replace(services, queue=queue)
    runs = svc.store.runs
    key = "agent:main:hook:parked-answered"
    target_key = "agent:main:hook:parked-target"
    target = start_run(svc, RunRequest(session_key=target_key, message="t"))["runId"]
    run_id = start_run(svc, RunRequest(session_key=key, message="hi"))["runId"]
    claimed = runs.claim(run_id, key)
    assert not isinstance(claimed, str), claimed
    call = ParkedCall(
        tool_call_id="call-1",
        tool_name="sessions_send",
        target_run_id=target,
        deadline_ms=now_ms() + 600_000,
    )
    assert runs.park(run_id, key, claimed.attempt, calls=[call], messages=[]) == "parked"

    sweeper.sweep(svc)  # its target still runs
    assert (run_id, key) not in queue.resumes

    target_claim = runs.claim(target, target_key)
    assert not isinstance(target_claim, str), target_claim
    runs.finish(target, target_key, target_claim.attempt, status="ok", reply="done")
    sweeper.sweep(svc)  # ended just now: its resume message is on its way
    assert (run_id, key) not in queue.resumes

    monkeypatch.setattr(sweeper, "_RESUME_GRACE_MS", 0)  # as if a while later
    report = sweeper.sweep(svc)
    assert queue.resumes.count((run_id, key)) == 1
    assert report.resumed >= 1
    assert runs.status(run_id) == "parked"  # the resume itself does the rest
