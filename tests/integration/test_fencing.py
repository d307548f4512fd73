"""A worker cut off from the store past its lane lease is fenced once it is back: its lease
renewal, its hand-back and its run's end or park are refused by the attempt another worker
took the run as, never applied; and its copy of the run stops."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from typing import Any

import pytest

from switchboard.shared.delivery import Target, dispatch, records
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.runtime import executor
from switchboard.shared.runtime.executor import execute_run
from switchboard.shared.runtime.leases import FENCED, LeaseKeeper, keeper_for
from switchboard.shared.services import Services
from switchboard.workers.handback import hand_back_runs
from switchboard_testkit.queues import RecordingQueue
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration


def _lease(svc: Services, key: str) -> float | None:
    score = svc.store.redis.zscore(svc.store.ks.beside(key).lane_leases, key)
    return None if score is None else float(score)


def _taken_over(svc: Services, key: str, run_id: str) -> int:
    """What the sweep and another worker do to a run whose lease lapsed: queued again
    and claimed again (its attempt moves on); answers the new attempt."""
    runs = svc.store.runs
    assert runs.requeue(run_id) == "queued"
    claimed = runs.claim(run_id, key)
    assert not isinstance(claimed, str), claimed
    return claimed.attempt


def _claimed(svc: Services, key: str, message: str = "hi") -> tuple[str, int]:
    run_id = str(start_run(svc, RunRequest(session_key=key, message=message))["runId"])
    claimed = svc.store.runs.claim(run_id, key)
    assert not isinstance(claimed, str), claimed
    return run_id, claimed.attempt


def test_a_stale_attempt_does_not_renew_the_lease_its_successor_holds(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease keeper of the worker that lost the run renews nothing for it: the lease
    stays where the run's new attempt put it (so the sweep can take the lane back if that
    worker vanishes too), the refusal is logged as fenced and the old copy is stopped."""
    key = "agent:main:hook:fence-renew"
    run_id, first = _claimed(services, key)
    keeper = LeaseKeeper(services.store.runs)
    stopped: list[str] = []
    with keeper.holding(key, run_id, attempt=first, on_superseded=lambda: stopped.append("x")):
        assert keeper.renew_now() == 1  # its own attempt: renewed
        second = _taken_over(services, key, run_id)
        assert second == first + 1
        lapsed = time.time() * 1000 - 60_000
        services.store.redis.zadd(services.store.ks.beside(key).lane_leases, {key: lapsed})
        with caplog.at_level(logging.WARNING, logger="switchboard.run"):
            assert keeper.renew_now() == 0
            assert keeper.renew_now() == 0  # refused once; not tried again
        assert _lease(services, key) == lapsed
        assert stopped == ["x"]
        assert keeper.held_runs() == []  # nothing of its own to hand back either
    fenced = [r.getMessage() for r in caplog.records if r.getMessage().startswith(FENCED)]
    assert fenced == [
        f"{FENCED} run {run_id} attempt {first}: lease renewal refused "
        "(another attempt has the run); stopping it"
    ], fenced


def test_the_current_attempt_is_renewed_and_an_ended_run_is_not(services: Services) -> None:
    key = "agent:main:hook:fence-current"
    run_id, attempt = _claimed(services, key)
    runs = services.store.runs
    stale = time.time() * 1000 - 60_000
    services.store.redis.zadd(services.store.ks.beside(key).lane_leases, {key: stale})
    assert runs.renew_held([(key, run_id, attempt)]) == []
    assert (_lease(services, key) or 0) > time.time() * 1000
    assert runs.finish(run_id, key, attempt, status="ok", reply="done").applied
    # The lane is free: no lease to renew, none recreated.
    assert runs.renew_held([(key, run_id, attempt)]) == [(key, run_id, attempt)]
    assert _lease(services, key) is None


def test_a_stale_worker_does_not_hand_back_a_run_another_worker_executes(
    services: Services,
) -> None:
    """A worker stopped after it was cut off past its lease hands back only the attempt it
    executed: the run another worker executes now stays running (not queued and sent a
    second time)."""
    queue = RecordingQueue()
    svc = dataclasses.replace(services, queue=queue)
    key = "agent:main:hook:fence-handback"
    run_id, first = _claimed(svc, key)
    _taken_over(svc, key, run_id)
    queue.runs.clear()
    assert hand_back_runs(svc, [(key, run_id, first)]) == 0
    assert svc.store.runs.status(run_id) == "running"
    assert queue.runs == []


def test_a_superseded_run_stops_and_writes_nothing(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """A run executing here whose run another worker took over (as the sweep does once
    the lease lapsed) is stopped by the lease keeper and ends nothing: no transcript
    message, no outcome; the new attempt's end is the run's only one."""
    key = "agent:main:hook:fence-stop"
    run_id = str(
        start_run(services, RunRequest(session_key=key, message="/sleep 30\nslow"))["runId"]
    )
    loop = asyncio.new_event_loop()
    done = threading.Event()

    def execute() -> None:
        try:
            loop.run_until_complete(execute_run(services, run_id, key))
        finally:
            done.set()

    thread = threading.Thread(target=execute)
    with caplog.at_level(logging.WARNING, logger="switchboard.run"):
        thread.start()
        runs = services.store.runs
        deadline = time.monotonic() + 20
        while runs.status(run_id) != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        attempt = _taken_over(services, key, run_id)
        keeper_for(runs).renew_now()  # the keeper's next turn (it runs every lease / 3)
        assert done.wait(20), "the superseded run did not stop"
    thread.join(5)
    loop.close()
    record = runs.get(run_id)
    assert record is not None and record.status == "running" and record.attempt == attempt
    # Only the run's user message (written once, by its first claim): nothing the stopped
    # copy did was kept.
    assert [m["role"] for m in services.store.transcripts.all(key)] == ["user"]
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"{FENCED} run {run_id} attempt 1: lease") for m in said), said
    assert f"run {run_id} attempt 1 stopped: superseded" in said, said


def test_a_superseded_run_makes_no_tool_call(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """A stale copy of a run whose model asks for a tool (its answer came while its worker
    was cut off) checks its attempt first: another attempt has the run, so the tool never
    runs (no second spawn) and nothing is written."""
    key = "agent:main:hook:fence-tool"
    spawn = json.dumps({"task": "child\n/reply child"})
    run_id = str(
        start_run(services, RunRequest(session_key=key, message=f"/tool sessions_spawn {spawn}"))[
            "runId"
        ]
    )
    stale = services.store.runs.claim(run_id, key, history=50)
    assert not isinstance(stale, str), stale
    attempt = _taken_over(services, key, run_id)
    with caplog.at_level(logging.WARNING, logger="switchboard.run"):
        asyncio.run(execute_run(services, run_id, key, claim=stale))
    assert services.store.sessions.children(key) == []  # no sub-agent spawned
    record = services.store.runs.get(run_id)
    assert record is not None and record.status == "running" and record.attempt == attempt
    assert [m["role"] for m in services.store.transcripts.all(key)] == ["user"]
    said = [r.getMessage() for r in caplog.records]
    expected = f"{FENCED} run {run_id} attempt {stale.attempt}: tool calls refused"
    assert any(m.startswith(expected) for m in said), said


@pytest.fixture
def config_data(webhook: WebhookReceiver) -> dict[str, Any]:
    """The `relay` channel bridged to the test's webhook receiver."""
    return {"channels": {"relay": {"webhook": {"url": webhook.url}}}}


def test_a_stale_delivery_attempt_does_not_post(
    services: Services, webhook: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A delivery step whose claim answered late (its worker was cut off past the
    attempt's lease, and the sweep gave the delivery to another attempt meanwhile) reads
    the delivery, finds the other attempt holds it, and posts nothing."""
    target = Target(channel="relay", to="group:room1")
    out = records.Outgoing(target, "once", "agent:main:relay:group:room1", "idem-fence", {})
    delivery_id, created = records.create(services, out)
    assert created
    stale = records.claim(services, delivery_id, 0)  # a lease that has lapsed at once
    assert stale.verdict == "ok" and stale.attempt == 1
    current = records.claim(services, delivery_id, 60_000)
    assert current.verdict == "ok" and current.attempt == 2
    found = records.get(services, delivery_id)
    assert found is not None
    with caplog.at_level(logging.WARNING, logger="switchboard.delivery"):
        dispatch._attempt(services, found, stale.attempt)
    time.sleep(0.5)
    assert webhook.received == []
    assert records.get(services, delivery_id)["status"] == "sending"  # type: ignore[index]
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"{FENCED} delivery {delivery_id} attempt 1: send") for m in said)


def test_a_stale_copy_leaves_a_cancel_request_to_the_current_attempt(
    services: Services,
) -> None:
    """A cancel request reaches every worker holding the run, the stale copy too: its
    cancelled end is refused, and the request stays for the attempt that has the run (its
    worker stops it), instead of being marked done by the copy."""
    key = "agent:main:hook:fence-cancel"
    run_id = str(
        start_run(services, RunRequest(session_key=key, message="/sleep 30\nslow"))["runId"]
    )
    runs = services.store.runs
    stale = runs.claim(run_id, key, history=50)
    assert not isinstance(stale, str), stale
    _taken_over(services, key, run_id)
    assert runs.cancel(run_id, key, error="stop").verdict == "requested"
    asyncio.run(asyncio.wait_for(execute_run(services, run_id, key, claim=stale), 20))
    assert runs.status(run_id) == "running"
    assert run_id in runs.cancel_requests()


def test_the_current_attempts_end_clears_the_cancel_request_in_the_same_step(
    services: Services,
) -> None:
    """The end step that applies takes the run's cancel request with it, however the run
    ended (a reply that raced the request too): no reader sees an ended run still asked to
    stop, and no second write is left to make after it."""
    runs = services.store.runs
    for n, status in enumerate(("cancelled", "ok")):
        key = f"agent:main:hook:fence-cancel-end-{n}"
        run_id, attempt = _claimed(services, key)
        assert runs.cancel(run_id, key, error="stop").verdict == "requested"
        assert run_id in runs.cancel_requests()
        assert not runs.finish(run_id, key, attempt + 1, status=status).applied
        assert run_id in runs.cancel_requests()  # a refused end leaves it
        assert runs.finish(run_id, key, attempt, status=status).applied
        assert run_id not in runs.cancel_requests()
        assert runs.status(run_id) == status


class _EndsBeforeRenewal:
    """The store's runs, where each fenced renewal reaches Redis only after ``end`` ran:
    the race of a run ending here while the keeper's renewal of it is on its way."""

    def __init__(self, runs: Any, end: Any) -> None:
        self._runs, self._end = runs, end

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runs, name)

    def renew_held(self, held: Any) -> Any:
        self._end()
        return self._runs.renew_held(held)


def test_a_renewal_answered_after_its_run_ended_here_is_not_fenced(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """The keeper's renewal of a run leaves; meanwhile the run ends on this worker and its
    block releases the lane. The renewal is refused (the run no longer runs) but nothing
    stale was running: no fenced write is logged and no stop callback is called."""
    key = "agent:main:hook:fence-race"
    run_id, attempt = _claimed(services, key)
    stopped: list[str] = []
    block: Any = None

    def end_here() -> None:
        block.__exit__(None, None, None)
        assert services.store.runs.finish(run_id, key, attempt, status="ok", reply="x").applied

    keeper = LeaseKeeper(_EndsBeforeRenewal(services.store.runs, end_here))  # type: ignore[arg-type]
    block = keeper.holding(key, run_id, attempt=attempt, on_superseded=lambda: stopped.append("x"))
    block.__enter__()
    with caplog.at_level(logging.WARNING, logger="switchboard.run"):
        assert keeper.renew_now() == 0
    assert stopped == []
    assert keeper.held() == []
    assert [r.getMessage() for r in caplog.records if FENCED in r.getMessage()] == []


def test_a_run_that_times_out_is_ended_after_its_lease_is_released(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run ending otherwise than with a result (here its timeout) is ended once its
    block no longer holds the lane for the keeper, as a run with a result is: the keeper
    never renews, and finds refused, the lease of a run this worker just ended."""
    key = "agent:main:hook:fence-timeout"
    request = RunRequest(session_key=key, message="/sleep 30\nslow", timeout_s=0.5)
    run_id = str(start_run(services, request)["runId"])
    keeper = keeper_for(services.store.runs)
    held_at_end: list[list[str]] = []
    finish = executor._finish

    def watched_finish(*args: Any, **kwargs: Any) -> bool:
        held_at_end.append(keeper.held())
        return finish(*args, **kwargs)

    monkeypatch.setattr(executor, "_finish", watched_finish)
    asyncio.run(execute_run(services, run_id, key))
    record = services.store.runs.get(run_id)
    assert record is not None and record.status == "timeout", record
    assert held_at_end == [[]], held_at_end
