"""The `switchboard.runs` task body: a message's runs side by side on one loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from switchboard.shared.config import Settings
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.runs import RunRecord
from switchboard.workers import tasks

pytestmark = pytest.mark.unit

PLAIN: Any = type("Svc", (), {"settings": Settings(fast_paths=False)})()


def _fake_runs(monkeypatch: pytest.MonkeyPatch, failing: set[str]) -> list[str]:
    """Replace the run and its follow-ups: each run yields once, then ends (or raises)."""
    ended: list[str] = []

    async def execute_run(svc: Any, run_id: str, session_key: str, **kw: Any) -> None:
        assert kw["claim"] is None  # the plain path: each run claims itself
        await asyncio.sleep(0)
        if run_id in failing:
            raise RuntimeError(f"{run_id} failed")
        ended.append(run_id)

    async def run_and_follow_up(
        svc: Any, start: Any, claimed: Any, outbox: Any, together: Any
    ) -> None:
        await start(None)

    monkeypatch.setattr(tasks, "execute_run", execute_run)
    monkeypatch.setattr(tasks, "_run_and_follow_up", run_and_follow_up)
    return ended


def test_every_run_of_a_message_runs() -> None:
    """All the runs of one message execute, each once."""
    with pytest.MonkeyPatch.context() as mp:
        ended = _fake_runs(mp, failing=set())
        claims = tasks._Claims(3)
        asyncio.run(tasks._run_together(PLAIN, [["r1", "k1"], ["r2", "k2"], ["r3", "k3"]], claims))
    assert sorted(ended) == ["r1", "r2", "r3"]


def test_a_failed_run_does_not_stop_the_others_and_is_raised_once_all_ended() -> None:
    """One run failing leaves the others to finish; the task then raises that failure."""
    with pytest.MonkeyPatch.context() as mp:
        ended = _fake_runs(mp, failing={"r2"})
        with pytest.raises(RuntimeError, match="r2 failed"):
            claims = tasks._Claims(3)
            asyncio.run(
                tasks._run_together(PLAIN, [["r1", "k1"], ["r2", "k2"], ["r3", "k3"]], claims)
            )
    assert sorted(ended) == ["r1", "r3"]


@pytest.mark.parametrize("fast_paths", [False, True], ids=["plain", "fast-paths"])
def test_follow_ups_run_in_place_only_with_the_fast_paths_on(
    monkeypatch: pytest.MonkeyPatch, fast_paths: bool
) -> None:
    """Off, a run is started with no follow-up list (its step is enqueued as it ends, and
    no run is taken here); on, the task collects its follow-ups to run them in place."""
    collected: list[list[RunRecord] | None] = []
    inline: list[bool] = []

    async def start(follow_ups: list[RunRecord] | None) -> None:
        collected.append(follow_ups)

    async def then_follow_up(svc: Any, start: Any, outbox: Any, together: Any) -> None:
        inline.append(True)
        await start([])

    monkeypatch.setattr(tasks, "_then_follow_up", then_follow_up)
    svc: Any = type("Svc", (), {"settings": Settings(fast_paths=fast_paths)})()
    claims = tasks._Claims(1)
    asyncio.run(tasks._run_and_follow_up(svc, start, claims.run()))
    assert collected == ([[]] if fast_paths else [None])
    assert inline == ([True] if fast_paths else [])
    assert claims.all.is_set() and claims.error is None  # told once the run ended


class _ClaimingRuns:
    """The runs store's `claim_many` as the fast path calls it: answers what it is given,
    or raises ``error``."""

    def __init__(self, answers: list[Any], error: BaseException | None = None) -> None:
        self.answers = answers
        self.error = error
        self.calls: list[list[tuple[str, str]]] = []

    def claim_many(self, runs: list[tuple[str, str]], *, history: int) -> list[Any]:
        self.calls.append(list(runs))
        if self.error is not None:
            raise self.error
        return self.answers


def _fast_svc(runs: _ClaimingRuns) -> Any:
    store = type("Store", (), {"runs": runs})()
    return type("Svc", (), {"settings": Settings(fast_paths=True), "store": store})()


def test_with_the_fast_paths_a_messages_runs_are_claimed_in_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One `claim_many` for the message's runs; each run is executed with its claim."""
    given: dict[str, Any] = {}

    async def execute_run(svc: Any, run_id: str, session_key: str, **kw: Any) -> None:
        given[run_id] = kw["claim"]
        kw["on_claimed"]()

    async def run_and_follow_up(
        svc: Any, start: Any, claimed: Any, outbox: Any, together: Any
    ) -> None:
        await start(None)

    monkeypatch.setattr(tasks, "execute_run", execute_run)
    monkeypatch.setattr(tasks, "_run_and_follow_up", run_and_follow_up)
    runs = _ClaimingRuns(["claim-1", "not-queued:done", "claim-3"])
    claims = tasks._Claims(3)
    asyncio.run(
        tasks._run_together(_fast_svc(runs), [["r1", "k1"], ["r2", "k2"], ["r3", "k3"]], claims)
    )
    assert runs.calls == [[("r1", "k1"), ("r2", "k2"), ("r3", "k3")]]
    assert given == {"r1": "claim-1", "r2": "not-queued:done", "r3": "claim-3"}
    assert claims.all.is_set() and claims.error is None


def test_a_failed_claim_of_a_messages_runs_fails_the_message() -> None:
    """The round trip failing tells every run's callback (the message is retried) and
    executes none."""
    runs = _ClaimingRuns([], error=StoreUnavailable("redis went away"))
    claims = tasks._Claims(2)
    with pytest.raises(StoreUnavailable):
        asyncio.run(tasks._run_together(_fast_svc(runs), [["r1", "k1"], ["r2", "k2"]], claims))
    assert claims.all.is_set() and isinstance(claims.error, StoreUnavailable)


def test_a_messages_claims_leave_the_loop_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """The claims' round trip is made off the run loop: the loop's other runs go on
    meanwhile (here, the one that lets the claim answer)."""
    on_loop: list[bool] = []
    loop_ran = threading.Event()

    class Waiting(_ClaimingRuns):
        def claim_many(self, runs: list[tuple[str, str]], *, history: int) -> list[Any]:
            on_loop.append(threading.current_thread() is threading.main_thread())
            assert loop_ran.wait(5), "the loop was held while the claims were out"
            return super().claim_many(runs, history=history)

    async def execute_run(svc: Any, run_id: str, session_key: str, **kw: Any) -> None:
        kw["on_claimed"]()

    async def run_and_follow_up(
        svc: Any, start: Any, claimed: Any, outbox: Any, together: Any
    ) -> None:
        await start(None)

    async def other_run() -> None:
        loop_ran.set()

    async def both() -> None:
        await asyncio.gather(
            tasks._run_together(_fast_svc(runs), [["r1", "k1"], ["r2", "k2"]], claims),
            other_run(),
        )

    monkeypatch.setattr(tasks, "execute_run", execute_run)
    monkeypatch.setattr(tasks, "_run_and_follow_up", run_and_follow_up)
    runs = Waiting(["claim-1", "claim-2"])
    claims = tasks._Claims(2)
    asyncio.run(both())
    assert on_loop == [False] and runs.calls == [[("r1", "k1"), ("r2", "k2")]]
    assert claims.all.is_set() and claims.error is None
