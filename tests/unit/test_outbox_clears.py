"""`OutboxClears`: the outbox entries a worker's follow-ups leave, cleared together."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from switchboard.workers.outbox_clears import OutboxClears

pytestmark = pytest.mark.unit


class _Recorder:
    def __init__(self, fail_first: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.fail_first = fail_first
        self.cleared = threading.Event()

    def __call__(self, run_ids: list[str]) -> None:
        self.calls.append(list(run_ids))
        if self.fail_first and len(self.calls) == 1:
            raise RuntimeError("the store is away")
        self.cleared.set()

    @property
    def ids(self) -> list[str]:
        return [i for call in self.calls for i in call]


def _until(done: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.005)


def test_entries_left_side_by_side_are_cleared_in_one_call() -> None:
    """Twenty callers handing ids within the linger: one clear, every id once."""
    clear = _Recorder()
    clears = OutboxClears(clear, linger_s=0.2)
    threads = [threading.Thread(target=clears.add, args=([f"r{i}"],)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _until(lambda: len(clear.ids) == 20)
    assert sorted(clear.ids) == sorted(f"r{i}" for i in range(20))
    assert len(clear.calls) == 1 and clears.batches == 1
    clears.close()


def test_adding_does_not_wait_for_the_round_trip() -> None:
    """A caller hands its ids and goes on: the clear happens on the thread, later."""
    clear = _Recorder()
    clears = OutboxClears(clear, linger_s=0.3)
    start = time.monotonic()
    clears.add(["r1", "r2"])
    assert time.monotonic() - start < 0.1
    assert clear.calls == []  # still gathering
    assert clear.cleared.wait(5)
    assert clear.calls == [["r1", "r2"]]
    clears.close()


def test_close_clears_what_is_pending_at_once_and_later_adds_clear_in_place() -> None:
    clear = _Recorder()
    clears = OutboxClears(clear, linger_s=30)  # only `close` ends the gathering
    clears.add(["r1"])
    _until(lambda: clears._thread is not None)
    start = time.monotonic()
    clears.close()
    assert time.monotonic() - start < 2
    assert clear.calls == [["r1"]]
    clears.add(["r2"])  # after close: nothing would clear it later
    assert clear.calls == [["r1"], ["r2"]]
    assert clears._thread is not None and not clears._thread.is_alive()


def test_a_failed_clear_is_logged_and_the_thread_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The entries of a failed clear are the sweep's; the next ones are cleared."""
    clear = _Recorder(fail_first=True)
    clears = OutboxClears(clear, linger_s=0.01)
    with caplog.at_level("ERROR", logger="switchboard.worker"):
        clears.add(["r1"])
        _until(lambda: len(clear.calls) == 1)
        _until(lambda: "clearing 1 outbox entries failed" in caplog.text)
    clears.add(["r2"])
    assert clear.cleared.wait(5)
    assert clear.calls == [["r1"], ["r2"]]
    clears.close()
