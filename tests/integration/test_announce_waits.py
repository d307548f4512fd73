"""A sub-agent's announce waits while its requester's lane holder has a turn to take."""

from __future__ import annotations

import pytest
import redis

from switchboard.shared.flows import subagent
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms
from switchboard.shared.store.spawns import SpawnRecord

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("status", "waits"),
    [
        ("queued", True),  # took the lane, or requeued after its worker died: runs next
        ("running", True),
        ("parked", True),
        ("ok", False),
        ("error", False),
        ("", False),  # gone
    ],
)
def test_the_announce_waits_for_a_lane_holder_that_has_a_turn_to_take(
    services: Services, redis_client: redis.Redis, status: str, waits: bool
) -> None:
    """The announce lands after the requester's turn: while the run holding its lane is
    queued (a sweep requeued it after its worker was killed, and no worker has claimed it
    yet), executing or parked, it waits; once that run has ended, it goes."""
    holder = "run-holder"
    if status:
        redis_client.hset(services.store.ks.run(holder), "status", status)
    spawn = SpawnRecord("spawn-1", {"endedAt": str(now_ms())})
    assert subagent._should_wait_for_requester(services, spawn, holder) is waits


def test_the_announce_stops_waiting_once_the_child_ended_long_ago(
    services: Services, redis_client: redis.Redis
) -> None:
    """However busy the requester stays, an announce waits at most `_BUSY_WAIT_MS` after its
    child ended."""
    redis_client.hset(services.store.ks.run("run-holder"), "status", "queued")
    ended = now_ms() - subagent._BUSY_WAIT_MS - 1
    spawn = SpawnRecord("spawn-1", {"endedAt": str(ended)})
    assert not subagent._should_wait_for_requester(services, spawn, "run-holder")
    assert not subagent._should_wait_for_requester(services, spawn, None)
