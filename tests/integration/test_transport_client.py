"""The broker channel against a real Redis: one redis client per connection pool, and the
broker's copies of messages in flight kept only with the fast paths off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection

from switchboard.shared.config import Settings
from switchboard.workers.app import create_celery_app
from switchboard.workers.queue import CeleryQueue
from switchboard.workers.routing import RUNS_QUEUE
from switchboard.workers.transport import Channel, PlainQoS

pytestmark = pytest.mark.integration

TRANSPORT = "switchboard.workers.transport:Transport"


@pytest.fixture
def broker(redis_url: str) -> Iterator[Connection]:
    """A kombu connection to the private Redis over the product's transport."""
    with Connection(redis_url, transport=TRANSPORT) as conn:
        yield conn


@pytest.fixture
def channel(broker: Connection) -> Any:
    """The product channel of `broker` (closed with the connection)."""
    chan = broker.default_channel
    assert isinstance(chan, Channel)
    return chan


def test_the_channel_hands_out_one_client_and_messages_still_flow(
    broker: Connection, channel: Any
) -> None:
    """`_create_client` returns the same client, bound to the channel's pool, and a message
    published and consumed through the connection arrives intact."""
    client = channel._create_client()
    assert channel._create_client() is client
    assert client.connection_pool is channel.pool
    assert client.ping()

    with broker.SimpleQueue("test-transport-client") as queue:
        queue.put({"runId": "r-1"})
        message = queue.get(timeout=5)
        message.ack()
    assert message.payload == {"runId": "r-1"}
    assert channel._create_client() is client


def test_a_new_pool_gets_a_new_client(channel: Any) -> None:
    """Once the channel's pool is replaced, `_create_client` builds a client on the new pool
    (and keeps returning that one)."""
    old = channel._create_client()
    old_pool = channel.pool
    channel._pool = None  # the next `channel.pool` builds a fresh pool

    new = channel._create_client()
    assert channel.pool is not old_pool
    assert new is not old
    assert new.connection_pool is channel.pool
    assert channel._create_client() is new
    assert new.ping()
    old_pool.disconnect()


def app_broker(redis_url: str, fast_paths: bool) -> Connection:
    """A connection made as the product's app makes it, fast paths on or off."""
    app = create_celery_app(Settings(redis_url=redis_url, fast_paths=fast_paths))
    return app.connection_for_read()


def test_with_the_fast_paths_on_the_broker_keeps_no_copy_of_a_message_taken(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Fast paths on: taking a message files no copy in kombu's `unacked` hash (no round
    trips for it); rejecting it with requeue still puts it back, acking it takes it for
    good."""
    with app_broker(redis_url, fast_paths=True) as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel) and not channel.ack_emulation
        assert isinstance(channel.qos, PlainQoS)
        with conn.SimpleQueue("test-plain-qos") as queue:
            queue.put({"runId": "r-1"})
            message = queue.get(timeout=5)
            assert not redis_client.exists("unacked", "unacked_index")
            message.reject(requeue=True)  # as a stopping worker hands a message back
            assert redis_client.llen("test-plain-qos") == 1
            again = queue.get(timeout=5)
            assert again.payload == {"runId": "r-1"}
            again.ack()
        assert redis_client.llen("test-plain-qos") == 0
        assert not redis_client.exists("unacked", "unacked_index")


def test_with_the_fast_paths_off_the_broker_keeps_its_copy_until_the_ack(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Fast paths off: kombu's ack emulation as shipped, a copy of the message taken kept
    in `unacked` until it is acked."""
    with app_broker(redis_url, fast_paths=False) as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel) and channel.ack_emulation
        with conn.SimpleQueue("test-emulated-qos") as queue:
            queue.put({"runId": "r-2"})
            message = queue.get(timeout=5)
            assert redis_client.hlen("unacked") == 1
            message.ack()
            assert redis_client.hlen("unacked") == 0


def test_a_stopping_worker_whose_connection_is_gone_leaves_what_it_took(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Fast paths on, the connection torn down: putting back what was taken and a reject
    with requeue are skipped (the sweeps recover it), not raised."""
    with app_broker(redis_url, fast_paths=True) as conn, conn.SimpleQueue("gone") as queue:
        queue.put({"runId": "r-3"})
        message = queue.get(timeout=5)
        channel = conn.default_channel
        qos, connection = channel.qos, channel.connection
        channel.connection = None  # as kombu leaves a broken connection
        try:
            message.reject(requeue=True)
            assert qos.restore_unacked() == []
        finally:
            channel.connection = connection  # for the close
        assert redis_client.llen("gone") == 0


def test_a_publish_without_a_declare_reaches_its_queue_on_a_fresh_redis(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Fast paths on, a run's message is published with no declare of its queue first: on a
    Redis nobody declared anything on, it is in the queue's list all the same, and a
    consumer of that queue takes it."""
    app = create_celery_app(Settings(redis_url=redis_url, fast_paths=True))
    try:
        queue = CeleryQueue(app)
        assert queue._declare == []
        queue.enqueue_run("run-1", "agent:main:s1")
        assert redis_client.llen(RUNS_QUEUE) == 1
        assert not redis_client.keys("_kombu.binding.*")  # nothing was declared
        with app.connection_for_read() as conn, conn.SimpleQueue(RUNS_QUEUE) as consumer:
            message = consumer.get(timeout=5)
            assert message.headers["task"] == "switchboard.run"
            assert message.payload[0] == ["run-1", "agent:main:s1"]
            message.ack()
    finally:
        app.close()
