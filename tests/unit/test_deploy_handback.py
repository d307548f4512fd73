"""The stopping worker's hand-back (`workers.handback.InFlight`): the lanes are read before
the runs are cancelled, every run in flight is cancelled, the hand-back runs once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator

import pytest

from switchboard.workers.handback import InFlight, Lanes

pytestmark = pytest.mark.unit


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop on a daemon thread, as the worker's run loops are."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_stop_cancels_runs_in_flight_and_hands_back_the_lanes_read_first(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Lanes are read while the runs still run; each run is cancelled; hand-back once."""
    in_flight = InFlight()
    started = [threading.Event() for _ in range(3)]
    unwound = [threading.Event() for _ in range(3)]

    async def slow_run(i: int) -> None:
        started[i].set()
        try:
            await asyncio.sleep(60)
        finally:
            unwound[i].set()

    futures = [
        asyncio.run_coroutine_threadsafe(in_flight.track(slow_run(i)), loop) for i in range(3)
    ]
    assert all(event.wait(5) for event in started)
    seen: dict[str, object] = {}

    def held() -> Lanes:
        seen["running_when_read"] = sum(not e.is_set() for e in unwound)
        return [("agent:main:a", "run-a")]

    def hand_back(lanes: Lanes) -> int:
        seen.setdefault("calls", []).append(lanes)  # type: ignore[union-attr]
        # Each run has unwound (its finally ran) before the hand-back. (The futures
        # here are told a moment later, on the loop: not what this checks.)
        seen["running_when_handed_back"] = sum(not e.is_set() for e in unwound)
        return len(lanes)

    in_flight.stop(hand_back, held)
    in_flight.stop(hand_back, held)  # a second signal does not hand back twice
    assert in_flight.handed_back.wait(10)
    assert seen == {
        "running_when_read": 3,
        "calls": [[("agent:main:a", "run-a")]],
        "running_when_handed_back": 0,
    }
    for future in futures:
        with pytest.raises(concurrent.futures.CancelledError):
            future.result(5)


def test_a_run_submitted_after_stop_never_starts(loop: asyncio.AbstractEventLoop) -> None:
    """Once stopping, a tracked run is cancelled before its first line runs."""
    in_flight = InFlight()
    in_flight.stop(lambda lanes: 0, lambda: [])
    assert in_flight.handed_back.wait(10)
    ran = threading.Event()

    async def run() -> None:
        ran.set()

    future = asyncio.run_coroutine_threadsafe(in_flight.track(run()), loop)
    with pytest.raises(BaseException) as caught:
        future.result(5)
    assert "Cancelled" in type(caught.value).__name__
    assert not ran.is_set()
