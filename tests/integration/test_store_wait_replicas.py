"""`Durability` (``SWITCHBOARD_REDIS_WAIT_REPLICAS``): the store client's acknowledged
writes (a run's accept, its end, a transcript append) go out with WAIT on the write's own
connection, on a private primary + replica; every other write goes out alone; a replica
that does not answer in time leaves the write standing and is counted and logged.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from switchboard.shared.errors import StoreUnavailable, Unavailable
from switchboard.shared.store import Store
from switchboard.shared.store.client import StoreRedis
from switchboard.shared.store.durability import ACKNOWLEDGED_SCRIPTS, Durability, NotReplicated
from switchboard.shared.store.lua_scripts import load as load_lua
from switchboard.shared.store.lua_scripts import script_names
from switchboard.shared.store.runs import NewRun, now_ms
from switchboard.supervisor.redis_server import RedisServer, find_redis_server

pytestmark = pytest.mark.integration


class _Replica(RedisServer):
    """A redis-server replicating ``primary``."""

    def __init__(self, data_dir: Path, primary: RedisServer) -> None:
        super().__init__(data_dir)
        self.primary = primary

    def _argv(self) -> list[str]:
        return [*super()._argv(), "--replicaof", "127.0.0.1", str(self.primary.port)]


@pytest.fixture(scope="module")
def replicated(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary and its synced replica of the module's own."""
    try:
        find_redis_server()
    except Unavailable as exc:
        pytest.skip(f"no redis-server to run a primary and a replica: {exc}")
    where = tmp_path_factory.mktemp("replicated")
    primary = RedisServer(where / "primary")
    primary.start()
    replica = _Replica(where / "replica", primary)
    try:
        replica.start()
        with replica.client() as client:
            for _ in range(200):
                if client.info("replication")["master_link_status"] == "up":
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the replica did not sync")
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


def _waits(primary: RedisServer) -> int:
    """How many WAIT commands the primary has run."""
    with primary.client() as client:
        stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def _new_run(n: int, session: str) -> NewRun:
    message = {"role": "user", "content": f"hello {n}", "timestamp": now_ms()}
    return NewRun(run_id=f"wait-run-{n}", session_key=session, message=message, timeout_s=60)


def test_acknowledged_writes_wait_for_the_replica_and_others_do_not(
    replicated: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = replicated
    with primary.client() as admin:
        admin.flushall()
        for name in ACKNOWLEDGED_SCRIPTS:  # loaded: no first call answered NOSCRIPT
            admin.script_load(load_lua(name).source)
    durability = Durability(1, 5000)
    store = Store.from_url(primary.url, durability=durability)
    try:
        assert isinstance(store.redis, StoreRedis)
        key = "agent:main:wait"
        before = _waits(primary)
        started = store.runs.start(_new_run(1, key), on_create={"chatType": "direct"})
        assert started.took_lane
        assert _waits(primary) == before + 1  # the accept
        claim = store.runs.claim("wait-run-1", key)
        assert not isinstance(claim, str)
        assert _waits(primary) == before + 1  # a claim is not an acknowledged write
        reply = {"role": "assistant", "content": "hi", "timestamp": now_ms()}
        ended = store.runs.finish("wait-run-1", key, claim.attempt, status="ok", messages=[reply])
        assert ended.applied
        assert _waits(primary) == before + 2  # the end
        seq = store.transcripts.append(key, {"role": "user", "content": "note"}, now_ms())
        assert seq >= 1
        assert _waits(primary) == before + 3  # an append outside a run
        store.redis.set("plain", "1")
        assert _waits(primary) == before + 3

        # A pipeline that queues an accept ends with one WAIT, on its own connection.
        pipe = store.pipeline()
        pipe.set("other", "1")
        store.runs.start_in(pipe, _new_run(2, key + "-b"), on_create={}, now=now_ms())
        store.runs.start_in(pipe, _new_run(3, key + "-c"), on_create={}, now=now_ms())
        replies = pipe.execute()
        assert len(replies) == 3 and replies[0] is True
        assert _waits(primary) == before + 4
        assert durability.short == 0

        # A script the server forgot is loaded again and still waited for (the call that
        # was answered NOSCRIPT went out with its WAIT too).
        with primary.client() as admin:
            admin.script_flush()
        store.transcripts.append(key, {"role": "user", "content": "again"}, now_ms())
        assert _waits(primary) == before + 6
        with replica.client() as copy:
            assert copy.exists("sb:r:wait-run-1", "sb:r:wait-run-2", "sb:r:wait-run-3") == 3
            assert copy.xlen(f"sb:t:{key}") == 4  # the run's two messages and two appends
    finally:
        store.close()


def test_off_sends_no_wait(replicated: tuple[RedisServer, RedisServer]) -> None:
    primary, _ = replicated
    store = Store.from_url(primary.url)
    try:
        before = _waits(primary)
        key = "agent:main:no-wait"
        store.runs.start(_new_run(10, key), on_create={})
        store.transcripts.append(key, {"role": "user", "content": "x"}, now_ms())
        assert _waits(primary) == before
    finally:
        store.close()


def test_a_replica_that_does_not_answer_leaves_the_write_standing(
    replicated: tuple[RedisServer, RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    """With the replica stopped (SIGSTOP), WAIT times out and the write stands on the
    primary: an append's caller gets its answer and the shortfall is counted and logged
    once; a run's accept is refused (`NotReplicated`, a `StoreUnavailable`: the api's 503),
    and the same idempotency key answers the same run once the replica is back."""
    primary, replica = replicated
    durability = Durability(1, 200)
    store = Store.from_url(primary.url, durability=durability)
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    stopped = True
    try:
        with caplog.at_level(logging.WARNING, logger="switchboard.store"):
            key = "agent:main:short"
            for n in range(3):
                seq = store.transcripts.append(key, {"role": "user", "content": f"{n}"}, now_ms())
                assert seq == n + 1
        assert durability.short == 3 and durability.refused == 0
        warnings = [r for r in caplog.records if "fewer than 1 replicas" in r.getMessage()]
        assert len(warnings) == 1, caplog.text
        with primary.client() as client:
            assert client.xlen(f"sb:t:{key}") == 3

        run = _new_run(20, "agent:main:refused")
        with pytest.raises(NotReplicated) as refused:
            store.runs.start(run, on_create={}, idempotency_key="once")
        assert isinstance(refused.value, StoreUnavailable)
        assert durability.refused == 1
        with primary.client() as client:
            assert client.exists("sb:r:wait-run-20")  # it stands on the primary

        os.kill(replica.pid, signal.SIGCONT)
        stopped = False
        again = store.runs.start(_new_run(21, run.session_key), idempotency_key="once")
        assert again.existing_run_id == "wait-run-20"
        assert durability.refused == 1
    finally:
        if stopped:
            os.kill(replica.pid, signal.SIGCONT)
        store.close()


def test_every_acknowledged_script_exists() -> None:
    """The names `ACKNOWLEDGED_SCRIPTS` lists are scripts of the store (a rename fails here)."""
    assert set(ACKNOWLEDGED_SCRIPTS) <= set(script_names())


@pytest.mark.parametrize("durable", [True, False], ids=["wait", "off"])
def test_a_watched_runs_end_is_published_after_its_wait(
    replicated: tuple[RedisServer, RedisServer], durable: bool
) -> None:
    """With acknowledged writes on, a waiter hears of a run's end only once WAIT has
    answered (here after its whole timeout: the replica is stopped), so it is never told
    of an end a failover could still lose; off, the end is published from its script."""
    primary, replica = replicated
    wait_ms = 1500
    store = Store.from_url(primary.url, durability=Durability(1 if durable else 0, wait_ms))
    key = f"agent:main:published-{durable}"
    run_id = f"wait-run-{30 + durable}"
    started = store.runs.start(replace(_new_run(30 + durable, key), watched=True), on_create={})
    assert started.took_lane
    claim = store.runs.claim(run_id, key)
    assert not isinstance(claim, str)
    heard: list[tuple[float, dict[str, Any]]] = []
    listener = primary.client()
    subscriber = listener.pubsub()
    subscriber.subscribe(store.ks.run_events)
    assert subscriber.get_message(timeout=5)["type"] == "subscribe"

    def listen() -> None:
        message = subscriber.get_message(ignore_subscribe_messages=True, timeout=30)
        if message is not None:
            heard.append((time.monotonic(), json.loads(message["data"])))

    thread = threading.Thread(target=listen)
    thread.start()
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        ended = store.runs.finish(run_id, key, claim.attempt, status="ok", reply="done")
        returned = time.monotonic()
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    thread.join(30)
    subscriber.close()
    listener.close()
    store.close()
    assert ended.applied
    assert len(heard) == 1, heard
    at, body = heard[0]
    assert body["runId"] == run_id and body["run"]["status"] == "ok"
    assert body["run"]["reply"] == "done"
    if durable:  # heard after WAIT gave up on the stopped replica, not before
        assert returned - began >= wait_ms / 1000 * 0.9
        assert at >= began + wait_ms / 1000 * 0.9
