"""The broker channel against a real Redis: no broker copies of messages in flight, a
connection gone tolerated, and publishes without a declare."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection

from switchboard.shared.config import Settings
from switchboard.workers.app import create_celery_app
from switchboard.workers.queue import CeleryQueue
from switchboard.workers.routing import RUNS_QUEUE
from switchboard.workers.transport import Channel, TolerantQoS

pytestmark = pytest.mark.integration

TRANSPORT = "switchboard.workers.transport:Transport"


def app_broker(redis_url: str) -> Connection:
    """A connection made as the product's app makes it."""
    app = create_celery_app(Settings(redis_url=redis_url))
    return app.connection_for_read()


def test_the_broker_keeps_no_copy_of_a_message_taken(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Taking a message files no copy in kombu's `unacked` hash (no round
    trips for it); rejecting it with requeue still puts it back, acking it takes it for
    good."""
    with app_broker(redis_url) as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel) and not channel.ack_emulation
        assert isinstance(channel.qos, TolerantQoS)
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


def test_a_stopping_worker_whose_connection_is_gone_leaves_what_it_took(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """The connection torn down: putting back what was taken and a reject
    with requeue are skipped (the sweeps recover it), not raised."""
    with app_broker(redis_url) as conn, conn.SimpleQueue("gone") as queue:
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
    """A run's message is published with no declare of its queue first: on a
    Redis nobody declared anything on, it is in the queue's list all the same, and a
    consumer of that queue takes it."""
    app = create_celery_app(Settings(redis_url=redis_url))
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
