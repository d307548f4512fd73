"""The Redis broker transport, hardened for a broker that goes away under load.

With kombu's Redis transport, a worker whose broker connection drops while it holds
unacknowledged messages tries to put them back while closing the broken connection; the
connection is already half torn down, the attempt raises ``AttributeError``, and Celery
treats that as unrecoverable: the worker exits instead of reconnecting (the same happens
when a task that was running across the outage is rejected after the worker reconnected).
Here restore and reject of a message whose connection is gone are skipped. Nothing is
lost: the product does not count on the broker to give back what a worker held. Lane
leases recover runs, the pending-steps index recovers flow steps and the due index
recovers deliveries (``switchboard.shared.flows.sweeper``), long before the broker's
visibility timeout (2 h) would.

So the broker keeps no copy of the messages in flight: kombu's ack emulation is off
(`workers.app`, the transport's public ``ack_emulation`` option), sparing each message two
round trips (one to file it in the ``unacked`` hash before the worker may start it, one to
take it out) and the copy itself. A worker that stops cleanly still puts back what it
took and did not start (`TolerantQoS`, in memory); one that dies leaves it to the sweeps,
as it leaves its runs.

`SentinelTransport` is the same transport on kombu's Redis Sentinel channel: every new
broker connection asks the sentinels for the primary, so a worker that lost its broker to
a failover reconnects to the promoted replica (the broker URL `workers.app` makes from a
``redis+sentinel://`` one).
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from switchboard.shared.store.sentinel import PrimaryWatch, follow_primary

log = logging.getLogger("switchboard.worker")


class TolerantQoS(virtual.QoS):
    """Acks kept in memory (ack emulation off), tolerant of a connection that is gone:
    what it held is left to the product's sweeps."""

    def _connection_gone(self) -> bool:
        connection = self.channel.connection
        return connection is None or connection.client is None

    def restore_unacked(self) -> list[Any]:
        """Put the messages taken and not acked back, unless the connection is gone."""
        if self._connection_gone():
            if self._delivered:
                log.warning(
                    "broker connection lost with %d message(s) taken and not done; the "
                    "recovery sweep takes them over",
                    len(self._delivered),
                )
            self._delivered.clear()
            return []
        errors: list[Any] = super().restore_unacked()  # type: ignore[no-untyped-call]
        return errors

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        """Reject (requeue puts it back), unless its connection is gone."""
        if requeue and self._connection_gone():
            self._delivered.pop(delivery_tag, None)
            return
        super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]


class Channel(kombu_redis.Channel):
    """The Redis channel with the tolerant QoS."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        # kombu put its in-memory QoS in place (ack emulation off): the tolerant one.
        self.QoS = TolerantQoS  # type: ignore[assignment]


class Transport(kombu_redis.Transport):
    """The Redis transport with the tolerant channel (``broker_transport``)."""

    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (its pool asks the sentinels for the primary) with the
    tolerant QoS of `Channel`.

    Its publishing pool follows the primary as the store's do (`follow_primary`, at most
    every half second, on the thread that publishes): after a failover on purpose, an api
    or worker does not keep publishing to the demoted primary until Sentinel reconfigures
    it (what they wrote there would be lost). The consumer's connection moves when
    Sentinel reconfigures the old primary and closes its clients; until then it drains what
    was published there."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._primary_watch = PrimaryWatch()
        super().__init__(*args, **kwargs)

    def _create_client(self, asynchronous: bool = False) -> Any:
        client = super()._create_client(asynchronous)  # type: ignore[no-untyped-call]
        if not asynchronous and self._primary_watch.take_turn():
            follow_primary(client.connection_pool, self._primary_watch)
        return client


class SentinelTransport(kombu_redis.SentinelTransport):
    """The Redis Sentinel transport with the tolerant channel (``broker_transport`` for a
    ``sentinel://`` broker URL; ``master_name`` in the transport options)."""

    Channel = SentinelChannel
