"""The store's fast-path Redis client: each thread runs its commands on a connection of its own."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.client import connect
from switchboard.shared.store.thread_held import ThreadHeldRedis

pytestmark = pytest.mark.integration


@pytest.fixture
def client(redis_url: str) -> Iterator[ThreadHeldRedis]:
    """The client the product's services use with fast paths on, on the private Redis."""
    made = connect(redis_url, fast_paths=True)
    assert isinstance(made, ThreadHeldRedis)
    yield made
    made.close()


def _in_thread(fn: object) -> object:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(fn()))  # type: ignore[operator]
    thread.start()
    thread.join()
    return out[0]


def test_a_thread_keeps_one_connection_and_threads_do_not_share(
    client: ThreadHeldRedis,
) -> None:
    """Every command of a thread comes from the same server-side client id; another thread
    has its own id; the values written are all there."""
    here = {client.client_id() for _ in range(5)}
    assert len(here) == 1
    other = _in_thread(lambda: {client.client_id() for _ in range(5)})
    assert isinstance(other, set) and len(other) == 1
    assert here.isdisjoint(other)

    def write(n: int) -> None:
        for i in range(50):
            client.hset("held:h", f"{n}:{i}", i)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert client.hlen("held:h") == 400


def test_pipelines_and_pubsub_take_their_own_connections(client: ThreadHeldRedis) -> None:
    """A pipeline and a subscription run beside the thread's connection, not on it."""
    mine = client.client_id()
    pipe = client.pipeline(transaction=True)
    pipe.client_id()
    pipe.set("held:k", "v")
    (pipe_id, _) = pipe.execute()
    assert pipe_id != mine
    pubsub = client.pubsub()
    pubsub.subscribe("held:ch")
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"  # type: ignore[index]
    assert client.get("held:k") == b"v"  # the thread's connection is not subscribed
    assert client.publish("held:ch", "x") == 1
    message = pubsub.get_message(timeout=2)
    assert message is not None and message["data"] == b"x"
    pubsub.close()


def test_a_thread_that_ends_hands_its_connection_back(client: ThreadHeldRedis) -> None:
    """Threads come and go (the api's thread pool retires idle threads): their connections
    go back to the pool, so a hundred short-lived threads need only a few connections."""
    for _ in range(100):
        assert _in_thread(lambda: client.ping()) is True
    pool = client.connection_pool
    made = [c for c in pool._connections if c is not None]  # type: ignore[attr-defined]
    assert len(made) <= 3


def test_a_killed_connection_is_reconnected_by_the_next_command(
    client: ThreadHeldRedis, redis_url: str
) -> None:
    """The server drops the thread's connection (a restart, a timeout): the next command
    reconnects it and succeeds."""
    old = client.client_id()
    with redis.Redis.from_url(redis_url) as admin:
        assert admin.client_kill_filter(_id=old) == 1
    assert client.set("held:after", "1") is True
    assert client.client_id() != old
    assert client.get("held:after") == b"1"


def test_close_hands_the_connection_back_once(redis_url: str) -> None:
    """Closing the client puts this thread's connection back in the pool exactly once (a
    connection listed twice would be handed to two threads), and the client still works
    after, on a connection taken afresh."""
    client = connect(redis_url, fast_paths=True)
    pool = client.connection_pool
    assert client.ping() is True
    held = client.connection
    client.close()
    idle = [c for c in list(pool.pool.queue) if c is not None]  # type: ignore[attr-defined]
    assert idle.count(held) == 1
    assert client.ping() is True
    client.close()
    idle = [c for c in list(pool.pool.queue) if c is not None]  # type: ignore[attr-defined]
    assert len(idle) == len(set(map(id, idle)))


def test_commands_go_straight_to_the_connection_with_the_clients_reply_callbacks(
    client: ThreadHeldRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain command skips redis-py's client path and still gets its reply parsed as
    redis-py parses it (callbacks with their options); a command asking for undecoded
    bytes takes redis-py's path."""
    full_path: list[str] = []
    execute = redis.Redis._execute_command
    this_thread = threading.current_thread()

    def counting(self: redis.Redis, *args: object, **options: object) -> object:
        if threading.current_thread() is this_thread:  # not another store's follower thread
            full_path.append(str(args[0]))
        return execute(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "_execute_command", counting)
    client.hset("held:h", mapping={"a": "1", "b": "2"})
    client.zadd("held:z", {"x": 1.5, "y": 2})
    assert client.hgetall("held:h") == {b"a": b"1", b"b": b"2"}
    assert client.zrange("held:z", 0, -1, withscores=True) == [(b"x", 1.5), (b"y", 2.0)]
    script = client.register_script("return redis.call('HGET', KEYS[1], ARGV[1])")
    assert script(keys=["held:h"], args=["b"]) == b"2"  # loaded on NOSCRIPT, then run
    assert full_path == []
    assert client.dump("held:h")  # NEVER_DECODE: redis-py's own path
    assert full_path == ["DUMP"]


def test_a_command_whose_connection_fails_raises_and_the_next_reconnects(
    client: ThreadHeldRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection breaks as a command is sent: the caller gets the store's error, raised
    from redis-py's (the store's client makes no retries; a task retries its step), the
    connection is closed, and the next command reconnects and runs."""
    assert client.ping() is True
    conn = client.connection
    send = conn.send_command
    failures = [redis.ConnectionError("broken pipe")]

    def breaking(*args: object, **kwargs: object) -> None:
        if failures:
            conn.disconnect()
            raise failures.pop()
        send(*args, **kwargs)

    monkeypatch.setattr(conn, "send_command", breaking)
    with pytest.raises(StoreUnavailable) as raised:
        client.set("held:after-break", "1")
    assert isinstance(raised.value.__cause__, redis.ConnectionError)
    assert client.set("held:after-break", "2") is True
    assert client.get("held:after-break") == b"2"
