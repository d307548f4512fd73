"""A connection closed under redis-py as it writes is the store being away, not a bug.

On the api's event loop (uvloop), a write on a transport that has closed raises
``RuntimeError: unable to perform operation on <TCPTransport closed=True …>; the handler is
closed``, and redis-py raises it as it is. A failover makes that happen: a connection
opened to a primary as it dies, or cut by the sentinel follower as it connects, is closed
before redis-py's first write on it. The api answered such an `agent.wait` 500 (the
Sentinel failover test under a burst). The async store client raises `StoreUnavailable`
for it, which the api answers 503 with Retry-After.

The server here accepts every connection and resets it at once, so the reset lands at
every stage of a command: the connect, the first write, the read.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
import uvloop

from switchboard.shared.store.client import connect_async
from switchboard.shared.store.redis_errors import closed_transport

pytestmark = pytest.mark.integration

# Commands tried at most, and for how long, until the closed transport was met this often.
TRIES = 5000
TRIES_S = 30.0
MET = 3


@pytest.fixture
def resetting_server() -> Iterator[int]:
    """A loopback port whose server resets (RST) each connection as it accepts it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(128)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()
        thread.join(5)


def failures(port: int, pipelined: bool) -> Counter[str]:
    """Commands (or one-command pipelines) sent until a closed transport was met `MET`
    times: how many failed, by what they raised."""
    seen: Counter[str] = Counter()

    async def send() -> None:
        client = connect_async(f"redis://127.0.0.1:{port}/0", socket_timeout=2)
        began = time.monotonic()
        try:
            for _ in range(TRIES):
                try:
                    if pipelined:
                        await client.pipeline(transaction=False).ping().execute()
                    else:
                        await client.ping()
                except Exception as exc:  # every failure is counted, whatever it is
                    seen[kind(exc)] += 1
                met = seen[CLOSED] + seen["RuntimeError (closed transport)"]
                if met >= MET or time.monotonic() - began > TRIES_S:
                    return
        finally:
            await client.aclose()

    uvloop.run(send())
    return seen


CLOSED = "StoreUnavailable (closed transport)"


def kind(exc: Exception) -> str:
    """What a failed command raised: its type, and whether a closed transport was why."""
    cause = exc if isinstance(exc, RuntimeError) else exc.__cause__
    closed = cause is not None and closed_transport(cause)
    return f"{type(exc).__name__}{' (closed transport)' if closed else ''}"


@pytest.mark.parametrize("pipelined", [False, True], ids=["command", "pipeline"])
def test_a_write_on_a_connection_closed_under_it_is_store_unavailable(
    resetting_server: int, pipelined: bool
) -> None:
    seen = failures(resetting_server, pipelined)
    assert set(seen) <= {"StoreUnavailable", CLOSED}, seen
    assert seen[CLOSED] >= 1, f"the reset never closed a transport before redis-py's write: {seen}"


def test_only_the_closed_transport_runtime_error_is_the_stores() -> None:
    closed = RuntimeError(
        "unable to perform operation on <TCPTransport closed=True reading=False 0x5637>; "
        "the handler is closed"
    )
    assert closed_transport(closed)
    assert not closed_transport(RuntimeError("Event loop is closed"))
    assert not closed_transport(ValueError("the handler is closed"))


def test_another_runtime_error_is_raised_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug stays a bug: a RuntimeError that is not a closed transport is not turned into
    an outage."""

    async def fails(*_: object, **__: object) -> None:
        raise RuntimeError("Event loop is closed")

    monkeypatch.setattr(aioredis.Redis, "execute_command", fails)

    async def ping() -> None:
        client = connect_async("redis://127.0.0.1:1/0")
        try:
            await client.ping()
        finally:
            await client.aclose()

    with pytest.raises(RuntimeError, match="Event loop is closed"):
        asyncio.run(ping())
