"""The api's heartbeat: while the api serves, it writes that it is alive (`sb:apis`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator

from switchboard.shared.errors import Unavailable
from switchboard.shared.store import Store
from switchboard.shared.store.apis import API_HEARTBEAT_S, ApiBeat, ApiHeartbeats
from switchboard.shared.store.runs import now_ms

log = logging.getLogger("switchboard.api")


@contextlib.asynccontextmanager
async def api_heartbeat(store: Store, url: str) -> AsyncIterator[str]:
    """Write this api's heartbeat every API_HEARTBEAT_S while the block runs, and remove it
    at the end; yields the api id (`<host>:<pid>`)."""
    host, pid = socket.gethostname(), os.getpid()
    api_id = f"{host}:{pid}"
    beats = ApiHeartbeats(store.redis, store.ks)

    async def loop() -> None:
        while True:
            try:
                await asyncio.to_thread(beats.beat, ApiBeat(api_id, host, pid, url, now_ms()))
            except Unavailable as exc:  # /healthz reports the outage; this would repeat it
                log.debug("api heartbeat not written: %s", exc)
            await asyncio.sleep(API_HEARTBEAT_S)

    task = asyncio.create_task(loop(), name="api-heartbeat")
    try:
        yield api_id
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(Unavailable):
            await asyncio.to_thread(beats.remove, api_id)
