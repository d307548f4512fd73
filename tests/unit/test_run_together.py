"""The `switchboard.runs` task body: a message's runs side by side on one loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from switchboard.workers import follow_ups
from switchboard.workers.run_host import Claims

pytestmark = pytest.mark.unit

SVC: Any = object()


def _fake_runs(monkeypatch: pytest.MonkeyPatch, failing: set[str]) -> list[str]:
    """Replace the run and its follow-ups: each run yields once, then ends (or raises)."""
    ended: list[str] = []

    async def execute_run(svc: Any, run_id: str, session_key: str, **kw: Any) -> None:
        assert kw.get("claim") is None  # each run claims itself
        await asyncio.sleep(0)
        if run_id in failing:
            raise RuntimeError(f"{run_id} failed")
        ended.append(run_id)

    async def run_and_follow_up(svc: Any, start: Any, claimed: Any, waves: Any) -> None:
        await start(None)

    monkeypatch.setattr(follow_ups, "execute_run", execute_run)
    monkeypatch.setattr(follow_ups, "run_and_follow_up", run_and_follow_up)
    return ended


def test_every_run_of_a_message_runs() -> None:
    """All the runs of one message execute, each once."""
    with pytest.MonkeyPatch.context() as mp:
        ended = _fake_runs(mp, failing=set())
        claims = Claims(3)
        pairs = [["r1", "k1"], ["r2", "k2"], ["r3", "k3"]]
        asyncio.run(follow_ups.run_together(SVC, pairs, claims))
    assert sorted(ended) == ["r1", "r2", "r3"]


def test_a_failed_run_does_not_stop_the_others_and_is_raised_once_all_ended() -> None:
    """One run failing leaves the others to finish; the task then raises that failure."""
    with pytest.MonkeyPatch.context() as mp:
        ended = _fake_runs(mp, failing={"r2"})
        with pytest.raises(RuntimeError, match="r2 failed"):
            claims = Claims(3)
            asyncio.run(
                follow_ups.run_together(SVC, [["r1", "k1"], ["r2", "k2"], ["r3", "k3"]], claims)
            )
    assert sorted(ended) == ["r1", "r3"]
