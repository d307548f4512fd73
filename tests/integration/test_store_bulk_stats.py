"""Bulk loading (the testkit's BulkLoader), server stats (store.stats) and progress reads
(store.progress) on a real Redis."""

from __future__ import annotations

import pytest
import redis

from switchboard.shared.store import Store
from switchboard_testkit.bulk import BulkLoader, SessionRow

pytestmark = pytest.mark.integration

TEMPLATE = {"sessionId": "tpl", "createdAt": "1", "updatedAt": "2", "model": "echo", "seq": "0"}


def _rows(n: int) -> list[SessionRow]:
    kinds = ("group", "cron")
    return [
        SessionRow(
            f"agent:main:k{i}", "main", kinds[i % 2], f"sid-{i}", 1000 + i, 2000 + i, "group"
        )
        for i in range(n)
    ]


def test_write_sessions_stores_each_row_like_the_store_does(redis_client: redis.Redis) -> None:
    """Loaded sessions read back through SessionStore, with the sessionId and updatedAt indexes."""
    store = Store(redis_client, prefix="t:")
    bulk = BulkLoader(redis_client, store.ks)
    written: list[int] = []
    bulk.write_sessions(TEMPLATE, _rows(7), advance=written.append)
    assert sum(written) == 7
    entry = store.sessions.get("agent:main:k3")
    assert entry is not None
    assert entry.session_id == "sid-3" and entry.updated_at_ms == 2003
    assert entry.get("model") == "echo" and entry.get("chatType") == "group"
    assert store.sessions.key_for_session_id("sid-5") == "agent:main:k5"
    assert store.sessions.count() == 7
    index = store.ks.beside("agent:main:k1").updated_kind("main", "cron")
    assert redis_client.zscore(index, "agent:main:k1") == 2001
    assert sorted(k for k, _ in bulk.scan_sessions()) == sorted(
        f"agent:main:k{i}".encode() for i in range(7)
    )


def test_extend_transcript_repeats_payloads_under_sequence_ids(redis_client: redis.Redis) -> None:
    """A transcript grows to the asked length with <seq>-0 ids; the session's seq follows."""
    store = Store(redis_client, prefix="t:")
    store.transcripts.append("agent:main:x", {"role": "user", "content": "hi"}, now_ms=1)
    bulk = BulkLoader(redis_client, store.ks)
    payloads = bulk.transcript_payloads("agent:main:x")
    bulk.extend_transcript("agent:main:x", payloads, 12, advance=lambda _n: None)
    assert store.transcripts.length("agent:main:x") == 12
    assert [m["content"] for m in store.transcripts.tail("agent:main:x", 2)] == ["hi", "hi"]
    assert redis_client.hget(store.ks.session("agent:main:x"), "seq") == b"12"
    assert store.progress.transcript_lengths(["agent:main:x", "agent:main:none"]) == [12, 0]


def test_command_calls_count_what_ran_between_readings(redis_client: redis.Redis) -> None:
    """since() gives the calls per command made between two readings, leaving out INFO."""
    store = Store(redis_client, prefix="t:")
    before = store.stats.command_calls()
    redis_client.set("a", 1)
    redis_client.get("a")
    redis_client.get("a")
    assert store.stats.command_calls().since(before) == {"set": 1, "get": 2}
    assert store.stats.version().count(".") == 2
    assert store.stats.memory_bytes() > 0


def test_run_ends_answers_only_terminal_runs(redis_client: redis.Redis) -> None:
    """run_ends lists runs in a terminal status with their endedAt, and skips the rest."""
    store = Store(redis_client, prefix="t:")
    redis_client.hset(store.ks.run("r1"), mapping={"status": "ok", "endedAt": 55})
    redis_client.hset(store.ks.run("r2"), mapping={"status": "running"})
    assert store.progress.run_ends(["r1", "r2", "r3"]) == {"r1": ("ok", 55)}


def test_backlog_counts_queued_unacked_and_parked_work(redis_client: redis.Redis) -> None:
    """backlog is 0 on an idle database and counts every kind of pending work, the held
    lanes and pending steps too (what a worker holds with no copy in the broker); its
    command count matches what INFO commandstats sees."""
    store = Store(redis_client, prefix="t:")
    assert store.progress.backlog(["q1", "q2"]) == 0
    redis_client.rpush("q1", "m1", "m2")
    redis_client.hset("unacked", "tag", "m")
    redis_client.zadd(store.ks.home.parked_runs, {"r2": 1})
    redis_client.zadd(store.ks.home.lane_leases, {"agent:main:s": 1})
    redis_client.zadd(store.ks.home.pending_steps, {'["step", "f1"]': 1})
    before = store.stats.command_calls()
    assert store.progress.backlog(["q1", "q2"]) == 6
    sent = store.stats.command_calls().since(before)
    assert sent == store.progress.backlog_commands(["q1", "q2"])
    assert store.progress.parked_runs() == 1


def test_monitoring_sees_each_command_and_what_a_script_ran(redis_client: redis.Redis) -> None:
    """MONITOR through the store: a plain command with its client, a script call followed
    by the commands it ran (client ``lua``), nothing after the block ends."""
    store = Store(redis_client, prefix="t:")
    with store.stats.monitor() as watching:
        redis_client.set("t:m", "1")
        store.runs.release_lane("agent:main:m", "r1")  # a script: GET of the lane
        watching.wait_quiet(0.2)
    seen = watching.commands()
    redis_client.set("t:after", "1")
    names = [(c.client == "lua", c.name) for c in seen]
    at = names.index((True, "get"))  # after the script's EVALSHA (a first one loads it)
    assert names[at - 1] == (False, "evalsha")
    assert (False, "set") in names[:at]
    assert all(c.client.startswith("127.0.0.1:") for c in seen if c.client != "lua")
    assert not any("t:after" in c.command for c in watching.commands())
