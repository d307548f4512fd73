"""A pool's connections are cut (shut down, not closed) when its primary moved: the store's
followers do it from their thread, for sync pools and for the async pools of event loops,
uvloop's included (whose transport sockets refuse ``shutdown()`` itself)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

import pytest
import uvloop

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.client import connect_async, connect_plain
from switchboard.shared.store.follow import cut_connections

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def _cut_from_a_thread(pool: object) -> list[BaseException]:
    """Cut ``pool``'s connections from another thread, as a follower does; its errors."""
    errors: list[BaseException] = []

    def cut() -> None:
        try:
            cut_connections(pool)
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    thread = threading.Thread(target=cut)
    thread.start()
    thread.join(5)
    return errors


@pytest.mark.integration
@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_an_async_clients_connection_is_cut_on_either_loop(redis_url: str, loop_name: str) -> None:
    """The cut ends the connection (the server sees it go); the command that finds it cut
    fails as on a crash, and the next runs on a new connection."""

    async def scenario() -> None:
        client = connect_async(redis_url, socket_timeout=3)
        try:
            first = await client.client_id()
            assert _cut_from_a_thread(client.connection_pool) == []
            with connect_plain(redis_url) as admin:
                for _ in range(50):
                    listed = admin.client_list()
                    if all(int(c["id"]) != first for c in listed):
                        break
                    await asyncio.sleep(0.05)
                assert all(int(c["id"]) != first for c in listed), "the connection was not cut"
            with contextlib.suppress(StoreUnavailable):  # the command that finds it cut
                await client.client_id()
            assert await client.client_id() != first  # on a new connection
        finally:
            await client.aclose()

    loop = LOOPS[loop_name]()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()


@pytest.mark.integration
def test_a_sync_clients_connection_is_cut(redis_url: str) -> None:
    """The same for a sync pool (the workers' store, kombu's Sentinel pools)."""
    with connect_plain(redis_url, socket_timeout=3) as client:
        first = client.client_id()
        assert _cut_from_a_thread(client.connection_pool) == []
        assert client.client_id() != first
