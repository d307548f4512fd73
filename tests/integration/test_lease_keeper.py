"""The process's lease keeper renews every lane a run holds, in one write, and only those."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from switchboard.shared.runtime.leases import LATE, LeaseKeeper, keeper_for
from switchboard.shared.services import Services

pytestmark = pytest.mark.integration


def _score(svc: Services, key: str) -> float | None:
    score = svc.store.redis.zscore(svc.store.ks.beside(key).lane_leases, key)
    return None if score is None else float(score)


def test_held_leases_are_pushed_forward_and_released_ones_are_not(services: Services) -> None:
    runs = services.store.runs
    ks = services.store.ks
    stale = time.time() * 1000 - 60_000
    keys = [f"agent:main:lease-{i}" for i in range(3)]
    for key in keys:
        services.store.redis.zadd(ks.beside(key).lane_leases, {key: stale})
    keeper = LeaseKeeper(runs)
    assert keeper.interval_s == pytest.approx(1.0)  # a third of the 3 s lease, with a floor

    with keeper.holding(keys[0]), keeper.holding(keys[1]):
        with keeper.holding(keys[1]):  # held twice (a resumed run beside the first)
            assert sorted(keeper.held()) == keys[:2]
        assert sorted(keeper.held()) == keys[:2]
        deadline = time.monotonic() + 5
        while (_score(services, keys[0]) or 0) <= stale and time.monotonic() < deadline:
            time.sleep(0.1)
        now_ms = time.time() * 1000
        for key in keys[:2]:
            score = _score(services, key)
            assert score is not None and score > now_ms + 1_000, key  # ahead by ~ the lease
        assert _score(services, keys[2]) == stale  # never held here: left to the sweep
    assert keeper.held() == []

    renewed_at = _score(services, keys[0])
    time.sleep(keeper.interval_s * 1.5)
    assert _score(services, keys[0]) == renewed_at  # released: no longer renewed


def test_a_lane_no_longer_leased_is_not_leased_again(services: Services) -> None:
    """A lease the sweep took back (its entry removed) is not recreated by a renewal."""
    keeper = LeaseKeeper(services.store.runs)
    with keeper.holding("agent:main:lease-gone"):
        assert keeper.renew_now() == 1
    assert _score(services, "agent:main:lease-gone") is None


def test_one_keeper_per_store(services: Services) -> None:
    assert keeper_for(services.store.runs) is keeper_for(services.store.runs)


def test_an_attempt_ending_leaves_a_later_attempts_cancel_in_place(services: Services) -> None:
    """Attempt 1 of a run unwinds after attempt 2 of the same run started here: attempt 2
    can still be stopped by a cancel request."""
    keeper = LeaseKeeper(services.store.runs)
    stopped: list[int] = []
    key = "agent:main:lease-r"
    run_id = services.store.ks.new_id_beside(key)
    first = keeper.holding(key, run_id, lambda: stopped.append(1), attempt=1)
    first.__enter__()
    with keeper.holding(key, run_id, lambda: stopped.append(2), attempt=2):
        first.__exit__(None, None, None)  # the superseded attempt's block ends
        ks = services.store.ks  # a cancel request, as `cancel_run.lua` records it
        services.store.redis.zadd(ks.beside(key).cancel_requests, {run_id: time.time() * 1000})
        assert keeper.check_cancels() == 1
    assert stopped == [2]


class _SlowRenewals:
    """The store's runs with a lease of ``lease_s``, whose renewals each take ``delay_s``."""

    def __init__(self, runs: Any, lease_s: int, delay_s: float) -> None:
        self._runs, self.lease_s, self.delay_s, self.calls = runs, lease_s, delay_s, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runs, name)

    def renew_leases(self, keys: Any) -> None:
        self.calls += 1
        time.sleep(self.delay_s)
        self._runs.renew_leases(keys)


@pytest.mark.parametrize(("lease_s", "delay_s"), [(3, 0.0), (1, 1.2)])
def test_a_renewal_later_than_the_lease_is_logged(
    services: Services, caplog: pytest.LogCaptureFixture, lease_s: int, delay_s: float
) -> None:
    """Renewals held up past the lease (a busy process, a slow store) say so: the sweep
    may have given this process's runs to another attempt meanwhile. Timely ones do not."""
    runs = _SlowRenewals(services.store.runs, lease_s, delay_s)
    keeper = LeaseKeeper(runs)  # type: ignore[arg-type]
    logs = caplog.at_level(logging.WARNING, logger="switchboard.run")
    with logs, keeper.holding("agent:main:lease-late"):
        deadline = time.monotonic() + 10
        while runs.calls < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(delay_s + 0.2)  # the second renewal answered
    late = [r.getMessage() for r in caplog.records if r.getMessage().startswith(LATE)]
    assert runs.calls >= 2
    if delay_s:
        assert late and "past the 1 s lease (SWITCHBOARD_LANE_LEASE_S)" in late[0], late
    else:
        assert late == []
