"""`api.tools._waited`: a tool's wait after it acted (a send made) rides a store outage out
and never turns it into a 503 a client would retry; a wait that did not act passes it on.
(tests/faults/test_redis_restart.py does it with a real Redis restart.)"""

from __future__ import annotations

import asyncio

import pytest

from switchboard.api import tools
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.services import WaitFor
from switchboard.shared.store.runs import RunRecord
from switchboard.shared.tools import sessions_send

pytestmark = pytest.mark.unit


def _ended(run_id: str) -> RunRecord:
    return RunRecord(run_id=run_id, session_key="agent:main:target", status="ok", reply="pong")


class Store:
    """A wait whose store is away for its first ``away`` calls; the timeouts it was given."""

    def __init__(self, away: int) -> None:
        self.away = away
        self.timeouts: list[float] = []

    async def wait(self, w: WaitFor) -> RunRecord | None:
        self.timeouts.append(w.timeout_s)
        if len(self.timeouts) <= self.away:
            raise StoreUnavailable("Connection refused")
        return _ended(w.target_run_id)


def test_an_acted_wait_waits_again_until_the_store_is_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tools, "OUTAGE_RETRY_S", 0.01)
    store = Store(away=3)
    wait_for = WaitFor("run-1", 5.0, {"runId": "run-1"}, acted=True)
    got = asyncio.run(tools._waited(wait_for, store.wait))
    assert got == _ended("run-1")
    assert len(store.timeouts) == 4
    # Each wait again is for what is left of the first one's timeout, never more.
    assert store.timeouts[0] == 5.0
    assert all(a > b for a, b in zip(store.timeouts, store.timeouts[1:], strict=False))


def test_an_acted_wait_the_outage_outlasts_is_answered_as_unseen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tools, "OUTAGE_RETRY_S", 0.01)
    store = Store(away=10**6)
    wait_for = WaitFor("run-1", 0.05, {"runId": "run-1"}, acted=True)
    got = asyncio.run(tools._waited(wait_for, store.wait))
    assert got is not None and got.run_id == "run-1"
    assert got.status == "unknown" and not got.terminal
    assert len(store.timeouts) >= 2


def test_a_wait_that_did_not_act_passes_the_outage_on() -> None:
    store = Store(away=1)
    wait_for = WaitFor("run-1", 5.0, {"runId": "run-1"})
    with pytest.raises(StoreUnavailable):
        asyncio.run(tools._waited(wait_for, store.wait))
    assert store.timeouts == [5.0]


def test_a_send_answers_an_unseen_run_as_its_timeout() -> None:
    """What the client gets when the store stayed away: the send's own timeout result,
    with the ids to follow it up (the message was sent)."""
    context = {"runId": "run-1", "sessionKey": "target", "flowId": "flow-1", "timeoutS": 3}
    result = sessions_send.complete(None, context, RunRecord.unseen("run-1"))
    assert result["status"] == "timeout"
    assert result["runId"] == "run-1" and result["flowId"] == "flow-1"
    assert result["error"].startswith("No reply within 3s")
