"""The flows' own stores on a real Redis: pending steps, deliveries, spawns and flows."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.shared.services import Services
from switchboard.shared.store import Store
from switchboard.shared.store.deliveries import NewDelivery
from switchboard.shared.store.run_records import LinkAdvance
from switchboard.shared.store.spawns import SpawnRecord

pytestmark = pytest.mark.integration


@pytest.fixture
def store(services: Services) -> Store:
    """The store the worker's services use, on the test's private Redis."""
    return services.store


def test_a_step_enqueued_again_while_running_stays_pending(store: Store) -> None:
    """`done` forgets a step only at the score it started with; a newer enqueue keeps it."""
    store.pending.add('["t","a"]', 1_000)
    started = store.pending.score('["t","a"]')
    store.pending.add('["t","a"]', 2_000)  # enqueued again while it ran
    assert started == 1_000
    assert store.pending.done('["t","a"]', 1_000) is False
    assert store.pending.score('["t","a"]') == 2_000
    assert store.pending.done('["t","a"]', 2_000) is True
    assert store.pending.score('["t","a"]') is None


def test_lost_steps_are_taken_once_and_come_back_after_the_recheck(store: Store) -> None:
    """A lost step is taken by one sweep, pushed ``recheck_ms`` on, and taken again then."""
    store.pending.add('["t","lost"]', 100)
    store.pending.add('["t","later"]', 10_000)
    assert store.pending.take_lost(500, recheck_ms=1_000) == ['["t","lost"]']
    assert store.pending.take_lost(500, recheck_ms=1_000) == []
    assert store.pending.score('["t","lost"]') == 1_500
    assert store.pending.take_lost(1_500, recheck_ms=1_000) == ['["t","lost"]']


def test_due_deliveries_are_taken_by_the_same_rule_as_lost_steps(store: Store) -> None:
    """The due index is swept as the pending steps are: taken, pushed on, limited."""
    d1 = store.ks.new_id_beside("agent:main:x")
    new = NewDelivery(d1, "agent:main:x", {"deliveryId": d1, "status": "pending"}, 0, 60)
    assert store.deliveries.create(new, lost_at_ms=100) is True
    assert store.deliveries.create(new, lost_at_ms=100) is False  # one per id
    assert store.deliveries.take_due(50, recheck_ms=1_000) == []
    assert store.deliveries.take_due(100, recheck_ms=1_000) == [d1]
    assert store.redis.zscore(store.ks.beside_id(d1).deliveries_due, d1) == 1_100
    assert store.deliveries.take_due(100, recheck_ms=1_000) == []


def test_a_delivery_attempt_is_claimed_once_and_settled_by_its_holder(store: Store) -> None:
    """A claim holds the delivery until its lease ends; only that attempt settles it."""
    d2 = store.ks.new_id_beside("agent:main:x")
    new = NewDelivery(d2, "agent:main:x", {"deliveryId": d2, "status": "pending"}, 0, 60)
    store.deliveries.create(new, lost_at_ms=100)
    first = store.deliveries.claim(d2, now_ms=1_000, lease_until_ms=5_000, slack_ms=0)
    busy = store.deliveries.claim(d2, now_ms=2_000, lease_until_ms=6_000, slack_ms=0)
    assert (first.verdict, first.attempt, busy.verdict) == ("ok", 1, "busy")
    assert store.deliveries.settle(d2, 2, {"status": "delivered"}, ttl_s=60, due_ms=None) is False
    assert store.deliveries.settle(d2, 1, {"status": "delivered"}, ttl_s=60, due_ms=None)
    found = store.deliveries.get(d2)
    assert found is not None and (found["status"], found["attempts"]) == ("delivered", 1)
    assert store.redis.zscore(store.ks.beside_id(d2).deliveries_due, d2) is None


def test_a_batch_join_is_won_by_exactly_one_member(store: Store) -> None:
    """Members count themselves; the one completing the count wins, also on its retry."""
    store.spawns.create_batch("b1", {"batchId": "b1", "expected": 2, "join": "all"})
    assert store.spawns.count_done("b1", "s1") is False
    assert store.spawns.count_done("b1", "s2") is True
    assert store.spawns.count_done("b1", "s2") is True  # a retried step wins again
    assert store.spawns.count_done("b1", "s1") is False
    assert store.spawns.done_count("b1") == 2


def test_an_outcome_is_frozen_once_and_an_announce_appended_once(store: Store) -> None:
    """freeze keeps the first outcome; append_once lands one message for one state move."""
    s3 = store.ks.new_id_beside("agent:main:req")  # a spawn is in its requester's slot group
    store.spawns.create(s3, {"spawnId": s3, "status": "running"})
    assert store.spawns.freeze(s3, {"outcome": "ok", "result": "first"})
    assert not store.spawns.freeze(s3, {"outcome": "error", "result": "second"})
    spawn_key = store.ks.spawn(s3)
    message = {"role": "user", "content": "done"}
    args: dict[str, Any] = {"field": "announce", "expected": "", "new": "appended", "now_ms": 5}
    seq = store.spawns.append_once(spawn_key, "agent:main:req", message, **args)
    again = store.spawns.append_once(spawn_key, "agent:main:req", message, **args)
    found = store.spawns.get(s3)
    assert found is not None and found["result"] == "first" and found["announce"] == "appended"
    assert (seq, again) == (1, 0)
    assert store.transcripts.length("agent:main:req") == 1


def test_the_announce_reads_name_run_join_holder_and_requester(store: Store) -> None:
    """announce_reads answers what the announce step needs, the requester's when asked."""
    store.redis.hset(store.ks.run("r1"), mapping={"sessionKey": "k", "status": "ok"})
    store.spawns.create_batch("b2", {"join": "all"})
    store.redis.set(store.ks.lane("agent:main:req"), "r9")
    store.redis.hset(store.ks.session("agent:main:child"), "sessionId", "sid-1")
    spawn = SpawnRecord(
        "s4",
        {"runId": "r1", "batchId": "b2", "requesterKey": "agent:main:req",
         "childKey": "agent:main:child"},
    )  # fmt: skip
    reads = store.spawns.announce_reads(spawn, check_requester=True, read_requester=True)
    assert reads.run is not None and reads.run.status == "ok"
    assert (reads.join, reads.lane_holder, reads.child_session_id) == ("all", "r9", "sid-1")
    assert reads.requester_exists is False and reads.requester_entry is None


def test_a_flow_advances_only_from_where_it_was_seen(store: Store) -> None:
    """advance is a compare-and-set on (status, turn): it moves once, deleting a field
    given as None."""
    store.redis.hset(store.ks.flow("f1"), mapping={"status": "running", "turn": "0", "x": "1"})
    cas = LinkAdvance(
        status="running", turn="0", fields={"status": "announcing", "x": None}, ttl_s=60
    )
    assert store.flows.advance("f1", cas) is True
    assert store.flows.advance("f1", cas) is False
    assert store.flows.read_hash(store.ks.flow("f1")) == {"status": "announcing", "turn": "0"}
    assert 0 < store.redis.ttl(store.ks.flow("f1")) <= 60
    assert store.flows.record_once("f1", "run:1", "a") == "a"
    assert store.flows.record_once("f1", "run:1", "b") == "a"


def test_a_pipeline_sends_writes_of_several_stores_together(store: Store) -> None:
    """Writes queued on Store.pipeline() reach Redis only when it executes."""
    pipe = store.pipeline()
    store.spawns.create("s5", {"spawnId": "s5"}, client=pipe)
    store.spawns.schedule_archive("agent:main:child5", 42, client=pipe)
    assert store.spawns.get("s5") is None
    pipe.execute()
    assert store.spawns.get("s5") is not None
    assert store.spawns.archive_at("agent:main:child5") == 42
