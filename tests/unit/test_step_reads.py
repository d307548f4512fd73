"""A follow-up step run inline reads the run it follows from its end step, not the store."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from switchboard.shared.config import Settings, parse_config
from switchboard.shared.flows import steps
from switchboard.shared.queue import RunsTakenHere, TakingQueue
from switchboard.shared.services import Services
from switchboard.shared.store.runs import RunRecord
from switchboard_testkit.queues import RecordingQueue

pytestmark = pytest.mark.unit


def services_over(store: Any) -> Services:
    """Services over a fake store (only what the steps here read)."""
    return Services(
        store=store, config=parse_config({}), settings=Settings(), queue=RecordingQueue()
    )


class Runs:
    def __init__(self) -> None:
        self.reads: list[str] = []

    def get(self, run_id: str) -> RunRecord:
        self.reads.append(run_id)
        return RunRecord(run_id=run_id, session_key="agent:main:x", status="ok", reply="stored")


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> list[RunRecord | None]:
    """A registered step that reads runs r1 and r2 through `run_of`."""
    seen: list[RunRecord | None] = []

    def step(svc: Any) -> None:
        seen.extend([steps.run_of(svc, "r1"), steps.run_of(svc, "r2")])

    monkeypatch.setitem(steps.FLOW_STEPS, "test.probe", step)
    return seen


def test_the_run_followed_is_not_read_again(probe: list[RunRecord | None]) -> None:
    runs = Runs()
    svc = services_over(SimpleNamespace(runs=runs))
    ended = RunRecord(run_id="r1", session_key="agent:main:x", status="ok", reply="ended")
    steps.run_step_inline(svc, "test.probe", following=ended)
    assert probe[0] is ended
    assert probe[1] is not None and probe[1].reply == "stored"
    assert runs.reads == ["r2"]  # only the other run came from the store
    assert steps.run_of(svc, "r1") is not ended  # outside the step: the store again
    assert runs.reads == ["r2", "r1"]


def test_without_a_run_followed_every_read_goes_to_the_store(
    probe: list[RunRecord | None],
) -> None:
    runs = Runs()
    svc = services_over(SimpleNamespace(runs=runs))
    steps.run_step_inline(svc, "test.probe")
    assert runs.reads == ["r1", "r2"]


def test_a_hash_read_at_the_runs_end_is_taken_once_then_read_from_the_store() -> None:
    """Inside an inline step, the first read of a hash the followed run's end step read is
    served from there; the second read of it goes to the store."""
    store_reads: list[str] = []

    class _Flows:
        def read_hash(self, key: str) -> dict[str, str]:
            store_reads.append(key)
            return {"status": "done"}

    svc = services_over(SimpleNamespace(flows=_Flows()))
    rec = RunRecord(run_id="r1", session_key="agent:main:x", status="ok")
    rec.read_at_end = {"sb:flow:f1": {"status": "running"}}
    seen: list[dict[str, str]] = []

    def step(services: Any, *args: str) -> None:
        seen.append(steps.read_hash(services, "sb:flow:f1"))
        seen.append(steps.read_hash(services, "sb:flow:f1"))

    steps.FLOW_STEPS["test.read_twice"] = step
    try:
        steps.run_step_inline(svc, "test.read_twice", following=rec)
    finally:
        del steps.FLOW_STEPS["test.read_twice"]
    assert seen == [{"status": "running"}, {"status": "done"}]
    assert store_reads == ["sb:flow:f1"]
    assert rec.read_at_end == {"sb:flow:f1": {"status": "running"}}  # the run keeps its copy


def test_a_step_run_inline_is_handed_its_own_copy_of_the_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step sees the run it follows and (given the task's `RunsTakenHere`) a queue
    that offers it the runs it starts; the caller's services are left as they were."""
    svc = services_over(SimpleNamespace())
    here = RunsTakenHere(svc.queue, limit=1)
    ended = RunRecord(run_id="r1", session_key="agent:main:x", status="ok")
    seen: list[Services] = []

    def step(services: Services) -> None:
        seen.append(services)
        services.queue.enqueue_run("r2", "k2")  # taken by the task
        services.queue.enqueue_run("r3", "k3")  # no room left: a message

    monkeypatch.setitem(steps.FLOW_STEPS, "test.starts", step)
    steps.run_step_inline(svc, "test.starts", following=ended, taken=here)
    (inner,) = seen
    assert inner is not svc and svc.inline is None and steps.following(svc) is None
    assert steps.following(inner) is ended
    assert isinstance(inner.queue, TakingQueue) and inner.queue.inner is svc.queue
    assert list(here.runs) == [("r2", "k2")]
    assert svc.queue.runs == [("r3", "k3")]  # type: ignore[attr-defined]


def test_a_step_run_inline_without_a_task_taking_runs_enqueues_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without ``taken`` every run the step starts goes out as a message."""
    svc = services_over(SimpleNamespace())

    def step(services: Services) -> None:
        assert services.inline is not None and services.inline.claim_history() is None
        services.queue.enqueue_run("r2", "k2")

    monkeypatch.setitem(steps.FLOW_STEPS, "test.starts", step)
    steps.run_step_inline(svc, "test.starts")
    assert svc.queue.runs == [("r2", "k2")]  # type: ignore[attr-defined]
