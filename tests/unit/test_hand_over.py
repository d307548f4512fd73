"""The worker's hand-over (`workers.tasks.hand_over`): a message's task returns once its
runs are claimed while the runs go on; a failure before the claim is the task's (its
message is retried); the process's limit of runs in flight makes the next message wait."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from switchboard.workers import tasks
from switchboard.workers.handback import InFlight

pytestmark = pytest.mark.unit


@pytest.fixture
def in_flight(monkeypatch: pytest.MonkeyPatch) -> Iterator[InFlight]:
    """A fresh in-flight register with a small limit, in place of the process's."""
    fresh = InFlight(limit=3)
    monkeypatch.setattr(tasks, "_in_flight", fresh)
    yield fresh
    assert fresh.wait_idle(10), "runs left in flight"


def test_the_task_returns_once_claimed_while_the_run_goes_on(in_flight: InFlight) -> None:
    release = threading.Event()
    ended = threading.Event()

    def body(claims: tasks._Claims) -> Coroutine[Any, Any, None]:
        claimed = claims.run()

        async def run() -> None:
            claimed()  # the claim step answered
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)
            ended.set()

        return run()

    tasks.hand_over(1, body)
    assert not ended.is_set()
    assert in_flight.taken == 1
    release.set()
    assert ended.wait(10)


def test_a_failure_before_the_claim_fails_the_task(in_flight: InFlight) -> None:
    def body(claims: tasks._Claims) -> Coroutine[Any, Any, None]:
        claimed = claims.run()

        async def run() -> None:
            try:
                raise ConnectionError("store away")
            except BaseException as exc:
                claimed(exc)
                raise

        return run()

    with pytest.raises(ConnectionError, match="store away"):
        tasks.hand_over(1, body)


def test_a_run_that_ends_without_a_claim_step_returns(in_flight: InFlight) -> None:
    """A run with nothing to do (not found, not the lane holder) never calls back: its end
    counts."""

    async def nothing() -> None:
        return None

    tasks.hand_over(1, lambda claims: nothing())


def test_at_the_limit_the_next_message_waits_for_a_run_to_end(in_flight: InFlight) -> None:
    release = threading.Event()

    def body(claims: tasks._Claims) -> Coroutine[Any, Any, None]:
        counted = [claims.run() for _ in range(3)]

        async def runs() -> None:
            for claimed in counted:
                claimed()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)

        return runs()

    tasks.hand_over(3, body)  # three runs: the limit
    assert in_flight.taken == 3 and in_flight.peak == 3
    waited = threading.Event()
    handed = threading.Event()

    def next_message() -> None:
        waited.set()
        tasks.hand_over(1, lambda claims: _ended_now())
        handed.set()

    thread = threading.Thread(target=next_message)
    thread.start()
    assert waited.wait(5)
    time.sleep(0.3)
    assert not handed.is_set(), "a fourth run went in flight past the limit"
    release.set()
    assert handed.wait(10)
    thread.join(5)


def test_a_stopping_worker_gives_the_message_back(in_flight: InFlight) -> None:
    from celery.exceptions import Reject

    in_flight.stop(lambda lanes: 0, lambda: [])
    with pytest.raises(Reject):
        tasks.hand_over(1, lambda claims: _ended_now())


async def _ended_now() -> None:
    return None
