"""`hand_back_runs`: a stopping worker's running runs go back to queued and out as messages;
a run that ended, or a lane now held by another run, is left alone."""

from __future__ import annotations

import dataclasses

import pytest

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
from switchboard.workers.handback import hand_back_runs
from switchboard_testkit.queues import RecordingQueue

pytestmark = pytest.mark.integration


def test_running_runs_are_queued_again_and_resent(services: Services) -> None:
    """Running and holding its lane: queued again, its lease pushed, its message re-sent."""
    queue = RecordingQueue()
    svc = dataclasses.replace(services, queue=queue)
    key = "agent:main:hook:handback"
    run_id = start_run(svc, RunRequest(session_key=key, message="hi"))["runId"]
    claimed = svc.store.runs.claim(run_id, key)
    assert not isinstance(claimed, str), claimed
    assert svc.store.runs.status(run_id) == "running"
    queue.runs.clear()

    assert hand_back_runs(svc, [(key, run_id)]) == 1
    assert svc.store.runs.status(run_id) == "queued"
    assert queue.runs == [(run_id, key)]
    assert svc.store.runs.lane_holder(key) == run_id
    # Handed back already (not running): a second hand-back does nothing.
    assert hand_back_runs(svc, [(key, run_id)]) == 0
    assert queue.runs == [(run_id, key)]


def test_a_lane_now_held_by_another_run_is_left_alone(services: Services) -> None:
    """The lane's holder is not the run this worker had: nothing is requeued or sent."""
    queue = RecordingQueue()
    svc = dataclasses.replace(services, queue=queue)
    key = "agent:main:hook:moved"
    run_id = start_run(svc, RunRequest(session_key=key, message="hi"))["runId"]
    assert not isinstance(svc.store.runs.claim(run_id, key), str)
    queue.runs.clear()
    assert hand_back_runs(svc, [(key, "some-other-run")]) == 0
    assert svc.store.runs.status(run_id) == "running"
    assert queue.runs == []
