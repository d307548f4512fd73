"""`Follower`: the thread that follows a pool's primary ends when stopped or with its pool,
and a check that fails is logged without ending it."""

from __future__ import annotations

import gc
import logging
import time

import pytest

from switchboard.shared.store.follow import Follower
from switchboard_testkit.calls import wait_until

pytestmark = pytest.mark.unit


class Pool:
    """Stands for a connection pool: anything a weak reference can name."""


def test_a_failing_check_is_logged_and_the_following_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[Pool] = []

    def check(pool: Pool) -> None:
        calls.append(pool)
        if len(calls) == 1:
            raise TypeError("a check that fails")

    pool = Pool()
    with caplog.at_level(logging.ERROR, logger="switchboard.store"):
        follower = Follower(pool, check, every_s=0.01, name="test-follower")
        wait_until(lambda: len(calls) >= 3, "three checks", timeout_s=5)
        follower.stop(join_s=2)
    assert not follower.running
    assert calls[0] is pool
    assert "a check that fails" in caplog.text


def test_stop_ends_it_at_once_and_runs_on_end() -> None:
    ended: list[bool] = []
    pool = Pool()
    follower = Follower(
        pool, lambda _: None, every_s=60, name="test-follower", on_end=lambda: ended.append(True)
    )
    started = time.monotonic()
    follower.stop(join_s=2)
    assert not follower.running
    assert time.monotonic() - started < 1  # not after its 60 s wait
    assert ended == [True]


def test_it_ends_with_its_pool() -> None:
    ended: list[bool] = []
    pool = Pool()
    follower = Follower(
        pool, lambda _: None, every_s=0.01, name="test-follower", on_end=lambda: ended.append(True)
    )
    del pool
    gc.collect()
    wait_until(lambda: not follower.running, "the follower to end", timeout_s=5)
    assert ended == [True]
