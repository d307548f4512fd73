"""Children that end together are announced together: the announce steps of a wave read
in one round trip and write in one more, each child is announced exactly once (a second
go makes nothing new), and a step that cannot go on yet fails alone.

The steps run in process against the private Redis, as a worker runs the follow-ups of
the runs that ended in one turn of its loop (`steps.run_follow_ups`); the children's
runs are claimed and ended by hand (no worker), each end step reading what its announce
reads first, as a worker's does."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.shared.errors import Unavailable
from switchboard.shared.flows import subagent
from switchboard.shared.flows.steps import inline_services, run_follow_ups
from switchboard.shared.runtime import executor
from switchboard.shared.services import Services
from switchboard.shared.store.runs import RunRecord
from switchboard.shared.tools.registry import ToolContext
from switchboard.shared.tools.sessions_spawn import sessions_spawn

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
CHILDREN = 6


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Room for a wave of children."""
    return {"agents": {"defaults": {"subagents": {"maxChildrenPerAgent": 20}}}}


def _spawn_and_end(services: Services, n: int) -> list[RunRecord]:
    """A batch of ``n`` children from main (join each), each one's run claimed and ended
    with its reply; the ended runs as their end steps stored them."""
    ctx = ToolContext(services=services, session_key=MAIN, agent_id="main")
    tasks = [{"task": f"child {i}", "label": f"wave-{i}"} for i in range(n)]
    started = sessions_spawn(ctx, {"tasks": tasks})
    assert started["status"] == "accepted", started
    runs = services.store.runs
    ended = []
    for i, item in enumerate(started["runs"]):
        rec = runs.get(str(item["runId"]))
        assert rec is not None
        claim = runs.claim(rec.run_id, rec.session_key)
        assert not isinstance(claim, str)
        done = runs.finish(
            rec.run_id,
            rec.session_key,
            claim.attempt,
            status="ok",
            reply=f"reply of child {i}",
            follow_up_reads=executor._follow_up_reads(services, rec),
        )
        assert done.applied and done.run is not None
        ended.append(done.run)
    return ended


def _announces(services: Services) -> list[str]:
    return [
        str(m["content"])
        for m in services.store.transcripts.tail(MAIN, 100)
        if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
    ]


class _RoundTrips:
    """Counts the store's round trips from here on: pipelines executed and single
    commands sent."""

    def __init__(self, services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pipelines: list[int] = []
        self.commands: list[str] = []
        client = services.store.redis
        real_pipeline, real_command = client.pipeline, client.execute_command
        counts = self

        def pipeline(*args: Any, **kwargs: Any) -> Any:
            pipe = real_pipeline(*args, **kwargs)
            real_execute = pipe.execute

            def execute(*args: Any, **kwargs: Any) -> Any:
                counts.pipelines.append(len(pipe))
                return real_execute(*args, **kwargs)

            pipe.execute = execute  # type: ignore[method-assign]
            return pipe

        def execute_command(*args: Any, **kwargs: Any) -> Any:
            counts.commands.append(str(args[0]))
            return real_command(*args, **kwargs)

        monkeypatch.setattr(client, "pipeline", pipeline)
        monkeypatch.setattr(client, "execute_command", execute_command)


def test_a_wave_of_announces_reads_in_one_round_trip_and_writes_in_one(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended = _spawn_and_end(services, CHILDREN)
    trips = _RoundTrips(services, monkeypatch)
    cleared = run_follow_ups(services, [(rec, None) for rec in ended])
    assert cleared == [True] * CHILDREN
    # The reads of all, the writes of all, and the batch kept for the retention by the
    # member that finished it last.
    assert len(trips.pipelines) == 3, trips.pipelines
    assert trips.pipelines[2] == 2  # the batch's two expiries
    assert trips.commands == []
    announces = _announces(services)
    assert len(announces) == CHILDREN
    for i in range(CHILDREN):
        assert sum(f"reply of child {i}" in a for a in announces) == 1
    spawns = services.store.spawns.get_many([str(rec.meta["spawnId"]) for rec in ended])
    assert all(s is not None and s.get("announce") == "delivered" for s in spawns)
    assert all(s is not None and s.get("status") == "done" for s in spawns)
    assert services.store.spawns.active_children(MAIN) == []
    deliveries = [services.store.deliveries.get(str(s["deliveryId"])) for s in spawns if s]
    assert [d and d.get("status") for d in deliveries] == ["delivered"] * CHILDREN


def test_a_second_go_at_the_same_wave_makes_nothing_new(services: Services) -> None:
    ended = _spawn_and_end(services, CHILDREN)
    run_follow_ups(services, [(rec, None) for rec in ended])
    first = _announces(services)
    # Again, as a worker that died before clearing their outbox entries would be followed
    # by the sweep (its copies of the steps are read from the store, not the end step).
    again = [(inline_services(services), (str(rec.meta["spawnId"]),)) for rec in ended]
    assert subagent.announce_together(again) == [None] * CHILDREN
    assert _announces(services) == first
    assert len(first) == CHILDREN


def test_a_step_that_cannot_go_on_yet_fails_alone(services: Services) -> None:
    ended = _spawn_and_end(services, 3)
    spawn_ids = [str(rec.meta["spawnId"]) for rec in ended]
    services.store.spawns.update(spawn_ids[1], {"status": "starting"})
    # The second is read from the store (not its end step): still being recorded.
    steps = [
        (inline_services(services, following=rec if i != 1 else None), (spawn_id,))
        for i, (rec, spawn_id) in enumerate(zip(ended, spawn_ids, strict=True))
    ]
    failed = subagent.announce_together(steps)
    assert failed[0] is None and failed[2] is None
    assert isinstance(failed[1], Unavailable)
    announces = _announces(services)
    assert len(announces) == 2
    assert not any("reply of child 1" in a for a in announces)
