"""A connection reset under redis-py as it writes is the store being away, not a bug.

A failover does it: a connection opened to a primary as it dies is closed before redis-py's
first write on it. On the api's event loop (uvloop) redis-py before 8.2 let uvloop's
``RuntimeError`` ("… the handler is closed") through, and the api answered such an
`agent.wait` 500; from 8.2 redis-py raises its own ``ConnectionError``, which the async store
client raises as `StoreUnavailable` (the api answers 503 with Retry-After).

The server here accepts every connection and resets it at once, so the reset lands at
every stage of a command: the connect, the first write, the read.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
import uvloop

from switchboard.shared.store.client import connect_async

pytestmark = pytest.mark.integration

# Commands (or one-command pipelines) sent at the resetting server.
TRIES = 2000


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
    """What `TRIES` commands (or one-command pipelines) raised, by type (``ok`` if one
    succeeded)."""
    seen: Counter[str] = Counter()

    async def send() -> None:
        client = connect_async(f"redis://127.0.0.1:{port}/0", socket_timeout=2)
        try:
            for _ in range(TRIES):
                try:
                    if pipelined:
                        await client.pipeline(transaction=False).ping().execute()
                    else:
                        await client.ping()
                except Exception as exc:  # every failure is counted, whatever it is
                    seen[type(exc).__name__] += 1
                else:
                    seen["ok"] += 1
        finally:
            await client.aclose()

    uvloop.run(send())
    return seen


@pytest.mark.parametrize("pipelined", [False, True], ids=["command", "pipeline"])
def test_a_write_on_a_connection_reset_under_it_is_store_unavailable(
    resetting_server: int, pipelined: bool
) -> None:
    seen = failures(resetting_server, pipelined)
    assert seen == {"StoreUnavailable": TRIES}, seen


def test_another_runtime_error_is_raised_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug stays a bug: a RuntimeError is not turned into an outage."""

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
