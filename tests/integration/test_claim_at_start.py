"""A run that the starting task executes itself is claimed in its start step
(`RunStore.start(claim_history=...)`): an announce run costs one round trip, not two."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from switchboard.api.scopes import OWNER
from switchboard.api.tools import _start_as
from switchboard.shared.queue import InlineStep, RunsTakenHere
from switchboard.shared.runtime.executor import execute_run
from switchboard.shared.services import Services
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.runs import Claim, NewRun
from switchboard.workers.follow_ups import then_follow_up
from switchboard_testkit import store_reads
from switchboard_testkit.queues import RecordingQueue

pytestmark = pytest.mark.integration


@pytest.fixture
def config_data() -> dict[str, Any]:
    """A send with no reply-back rounds: primary run, then the announce run."""
    return {
        "session": {"agentToAgent": {"maxPingPongTurns": 0}},
        "tools": {"sessions": {"visibility": "agent"}},
    }


def _rid(name: str, key: str) -> str:
    """The id of the run a test calls ``name`` in session ``key`` (in its slot group)."""
    return store_reads.id_beside(key, name)


def _new_run(name: str, key: str) -> NewRun:
    return NewRun(
        run_id=_rid(name, key),
        session_key=key,
        message={"role": "user", "content": "hello there", "timestamp": 1},
        timeout_s=30,
    )


def test_a_run_that_takes_its_lane_is_claimed_in_its_start(services: Services) -> None:
    """The start answers the claim claim_run.lua would have: attempt 1, the run running with
    its deadline, its session hash and history (the user message, appended once), the
    run.started event written; a later claim of the same run is refused."""
    runs, key = services.store.runs, "agent:main:claim-a"
    started = runs.start(_new_run("run-ca", key), claim_history=10)
    assert started.took_lane
    claim = started.claim
    assert isinstance(claim, Claim) and claim.attempt == 1 and claim.started_published
    assert claim.run is not None and claim.run.status == "running"
    assert claim.deadline_at_ms > 0 and claim.run.deadline_at_ms == claim.deadline_at_ms
    assert claim.session is not None and claim.session.get("lastRunId") == _rid("run-ca", key)
    assert [m["content"] for m in claim.history or []] == ["hello there"]
    assert runs.get(_rid("run-ca", key)).status == "running"  # type: ignore[union-attr]
    types = [e["type"] for e in store_reads.events(services.store)]
    assert types.count("run.started") == 1
    assert runs.claim(_rid("run-ca", key), key) == "skip:running"


def test_a_run_queued_behind_its_lane_is_not_claimed(services: Services) -> None:
    """A second run of a busy session queues for the lane: no claim is made."""
    runs, key = services.store.runs, "agent:main:claim-b"
    runs.start(_new_run("run-cb1", key))
    second = runs.start(_new_run("run-cb2", key), claim_history=10)
    assert not second.took_lane and second.claim is None
    assert runs.get(_rid("run-cb2", key)).status == "queued"  # type: ignore[union-attr]


def test_a_sends_announce_run_is_executed_on_its_start_claim(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send's primary run executed as a worker task does: its follow-up starts the
    announce run, which runs in the same task on the claim of its start. Only the
    primary run makes a claim call; the flow ends done with the announce's reply."""
    claims: list[str] = []
    claim = services.store.runs.claim

    def counting(run_id: str, session_key: str, **kw: Any) -> Any:
        claims.append(run_id)
        return claim(run_id, session_key, **kw)

    monkeypatch.setattr(services.store.runs, "claim", counting)
    _, _, out = _start_as(
        services,
        "agent:main:main",
        "sessions_send",
        {"sessionKey": "agent:main:claim-c", "message": "ping", "timeoutSeconds": 0},
        OWNER,
        None,
    )
    assert isinstance(out, dict) and out["status"] == "accepted"
    primary = out["runId"]
    key = "agent:main:claim-c"
    asyncio.run(
        then_follow_up(services, lambda ups: execute_run(services, primary, key, follow_ups=ups))
    )
    assert claims == [primary]
    flow = services.store.redis.hgetall(services.store.ks.flow(out["flowId"]))
    fields = {as_text(k): as_text(v) for k, v in flow.items()}
    assert fields["status"] == "done"
    announce = services.store.runs.get(fields["announceRunId"])
    assert announce is not None and announce.status == "ok" and announce.attempt == 1
    assert fields["announceReply"] == announce.reply


def test_a_claimed_run_released_unrun_is_queued_again_and_sent(services: Services) -> None:
    """A task that stops before running a run it claimed at start puts it back to queued
    and sends its message, so any worker can claim it."""
    runs, key = services.store.runs, "agent:main:claim-d"
    sent = RecordingQueue()
    here = RunsTakenHere(sent, limit=4, history=10, requeue=runs.requeue)
    step = InlineStep(taken=here)  # what a follow-up step run by the task is handed
    assert step.claim_history() == 10
    started = runs.start(_new_run("run-cd", key), claim_history=step.claim_history())
    assert isinstance(started.claim, Claim)
    assert step.take_claimed(_rid("run-cd", key), key, started.claim)
    here.release()
    assert sent.runs == [(_rid("run-cd", key), key)]
    assert runs.get(_rid("run-cd", key)).status == "queued"  # type: ignore[union-attr]
    again = runs.claim(_rid("run-cd", key), key)
    assert isinstance(again, Claim) and again.attempt == 2
