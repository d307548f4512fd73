"""The broker channel reuses one redis client per connection pool, against a real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection

from switchboard.workers.transport import Channel

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
