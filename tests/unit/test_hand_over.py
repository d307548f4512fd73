"""The worker's hand-over (`RunHost.hand_over`): a message's task returns once its
runs are claimed while the runs go on; a failure before the claim is the task's (its
message is retried); the process's limit of runs in flight makes the next message wait."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from switchboard.workers import run_host as hosting
from switchboard.workers.handback import InFlight

pytestmark = pytest.mark.unit


@pytest.fixture
def host() -> Iterator[hosting.RunHost]:
    """A run host of its own with a small limit of runs in flight."""
    made = hosting.RunHost(max_in_flight=3)
    yield made
    assert made.in_flight.wait_idle(10), "runs left in flight"
    made.loops.close()


@pytest.fixture
def in_flight(host: hosting.RunHost) -> InFlight:
    """The host's runs in flight."""
    return host.in_flight


def test_the_task_returns_once_claimed_while_the_run_goes_on(
    host: hosting.RunHost, in_flight: InFlight
) -> None:
    release = threading.Event()
    ended = threading.Event()

    def body(claims: hosting.Claims) -> Coroutine[Any, Any, None]:
        claimed = claims.run()

        async def run() -> None:
            claimed()  # the claim step answered
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)
            ended.set()

        return run()

    host.hand_over(1, body)
    assert not ended.is_set()
    assert in_flight.taken == 1
    release.set()
    assert ended.wait(10)


def test_a_failure_before_the_claim_fails_the_task(
    host: hosting.RunHost, in_flight: InFlight
) -> None:
    def body(claims: hosting.Claims) -> Coroutine[Any, Any, None]:
        claimed = claims.run()

        async def run() -> None:
            try:
                raise ConnectionError("store away")
            except BaseException as exc:
                claimed(exc)
                raise

        return run()

    with pytest.raises(ConnectionError, match="store away"):
        host.hand_over(1, body)


def test_a_run_that_ends_without_a_claim_step_returns(
    host: hosting.RunHost, in_flight: InFlight
) -> None:
    """A run with nothing to do (not found, not the lane holder) never calls back: its end
    counts."""

    async def nothing() -> None:
        return None

    host.hand_over(1, lambda claims: nothing())


def test_at_the_limit_the_next_message_waits_for_a_run_to_end(
    host: hosting.RunHost, in_flight: InFlight
) -> None:
    release = threading.Event()

    def body(claims: hosting.Claims) -> Coroutine[Any, Any, None]:
        counted = [claims.run() for _ in range(3)]

        async def runs() -> None:
            for claimed in counted:
                claimed()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)

        return runs()

    host.hand_over(3, body)  # three runs: the limit
    assert in_flight.taken == 3 and in_flight.peak == 3
    waited = threading.Event()
    handed = threading.Event()

    def next_message() -> None:
        waited.set()
        host.hand_over(1, lambda claims: _ended_now())
        handed.set()

    thread = threading.Thread(target=next_message)
    thread.start()
    assert waited.wait(5)
    time.sleep(0.3)
    assert not handed.is_set(), "a fourth run went in flight past the limit"
    release.set()
    assert handed.wait(10)
    thread.join(5)


def test_a_stopping_worker_gives_the_message_back(
    host: hosting.RunHost, in_flight: InFlight
) -> None:
    from celery.exceptions import Reject

    in_flight.stop(lambda lanes: 0, lambda: [])
    with pytest.raises(Reject):
        host.hand_over(1, lambda claims: _ended_now())


async def _ended_now() -> None:
    return None


def test_the_apps_host_takes_its_limit_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """`SWITCHBOARD_WORKER_MAX_IN_FLIGHT` (or `worker --max-in-flight`, which overrides the
    setting) is the limit of the host the app's tasks hand their runs to."""
    from switchboard.shared.config import Settings
    from switchboard.workers.app import create_celery_app

    monkeypatch.setenv("SWITCHBOARD_WORKER_MAX_IN_FLIGHT", "7")
    settings = Settings(redis_url="redis://127.0.0.1:1/0")
    host = hosting.run_host(create_celery_app(settings))
    assert host is not None and host.in_flight.limit == 7
    flag = settings.model_copy(update={"worker_max_in_flight": 3})
    host = hosting.run_host(create_celery_app(flag))
    assert host is not None and host.in_flight.limit == 3
