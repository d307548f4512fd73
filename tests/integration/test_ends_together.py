"""Runs whose results came in together record their ends together: the end steps of a
wave go to the store in one round trip, each run's reply is read on its own (a fenced end
is refused alone, the others apply), and each ended run is collected for its follow-up.

The end steps run in process against the private Redis, as a worker's store thread runs
them for the runs of its loop (`executor.record_results`); the runs are claimed by hand."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.runtime.agent_loop import RunResult
from switchboard.shared.runtime.executor import Ending, record_results
from switchboard.shared.services import Services
from switchboard.shared.store.runs import Claim, RunRecord

pytestmark = pytest.mark.integration


def _claimed(services: Services, key: str) -> tuple[RunRecord, Claim]:
    run_id = str(start_run(services, RunRequest(session_key=key, message="hi"))["runId"])
    claim = services.store.runs.claim(run_id, key)
    assert not isinstance(claim, str) and claim.run is not None, claim
    return claim.run, claim


def _result(text: str) -> RunResult:
    return RunResult(
        output=text,
        messages=[
            ModelRequest(parts=[UserPromptPart(content="hi")]),
            ModelResponse(parts=[TextPart(content=text)]),
        ],
    )


def _count_round_trips(services: Services, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the pipelines executed from here on (one entry per round trip)."""
    sizes: list[int] = []
    client = services.store.redis
    real_pipeline = client.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        def execute(*a: Any, **kw: Any) -> Any:
            sizes.append(len(pipe))
            return real_execute(*a, **kw)

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe

    monkeypatch.setattr(client, "pipeline", pipeline)
    return sizes


def test_a_wave_of_ends_goes_in_one_round_trip_and_each_run_ends_with_its_reply(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    claimed = [_claimed(services, f"agent:main:hook:wave-{i}") for i in range(5)]
    collected: list[RunRecord] = []
    endings = [
        Ending(services, rec, claim, _result(f"reply {i}"), collected)
        for i, (rec, claim) in enumerate(claimed)
    ]
    sizes = _count_round_trips(services, monkeypatch)
    assert record_results(endings) == [None] * 5
    assert sizes == [5]  # the five end steps, in one round trip
    for i, (rec, _) in enumerate(claimed):
        ended = services.store.runs.get(rec.run_id)
        assert ended is not None
        assert (ended.status, ended.reply) == ("ok", f"reply {i}")
        tail = services.store.transcripts.tail(rec.session_key, 5)
        assert tail[-1]["role"] == "assistant" and f"reply {i}" in str(tail[-1]["content"])
    assert collected == []  # no run had a follow-up step


def test_a_fenced_end_in_a_wave_is_refused_alone(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    claimed = [_claimed(services, f"agent:main:hook:fenced-{i}") for i in range(3)]
    stale_rec, stale_claim = claimed[1]
    # Another worker took the second run over meanwhile: this copy's end is fenced.
    assert services.store.runs.requeue(stale_rec.run_id) == "queued"
    again = services.store.runs.claim(stale_rec.run_id, stale_rec.session_key)
    assert not isinstance(again, str) and again.attempt == stale_claim.attempt + 1
    endings = [
        Ending(services, rec, claim, _result(f"reply {i}"), None)
        for i, (rec, claim) in enumerate(claimed)
    ]
    assert record_results(endings) == [None] * 3
    statuses = [services.store.runs.status(rec.run_id) for rec, _ in claimed]
    assert statuses == ["ok", "running", "ok"]  # the new attempt still has the second
    assert "end (ok) refused" in caplog.text
