"""The api's async store: what the event loop reads from Redis without a thread.

`AsyncStore` holds one async client (`client.AsyncStoreClient`, so a Redis error arrives as
`StoreUnavailable`) and offers what the api needs on its loop: the run waiter's reads and
subscription (`run_waiter`), the events streams (`follow_events`), the auth
gate's lockout count (`count_failure`) and a readiness `ping`. Each api part
makes its own, because each needs its own socket timeout (a blocking stream read waits
longer than a lockout check may).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from switchboard.shared.store.client import AsyncStoreClient, connect_async
from switchboard.shared.store.event_follower import EventFollower
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.waiter import RunWaiter


@dataclass(frozen=True)
class FailureCount:
    """A client's failed authentications in the current window, and the window's TTL."""

    count: int
    ttl_s: int


class AsyncStore:
    """Async reads and writes of the api, on one async Redis client."""

    def __init__(self, client: AsyncStoreClient, ks: Keyspace) -> None:
        self.client = client
        self.ks = ks

    @classmethod
    def from_url(cls, url: str, ks: Keyspace, **options: Any) -> AsyncStore:
        """A store on a new async client for ``url`` (``options``: redis-py's, e.g. timeouts)."""
        return cls(connect_async(url, **options), ks)

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.client.aclose()

    async def ping(self) -> bool:
        """Whether Redis answers (raises `StoreUnavailable` when it does not)."""
        return bool(await self.client.ping())

    def run_waiter(self) -> RunWaiter:
        """A run waiter listening on this store's client."""
        return RunWaiter(self.client, self.ks)

    async def follow_events(self, after: str | None = None) -> EventFollower:
        """A follower of the events streams from after the event id ``after`` (one it
        gave), or from now on (None)."""
        if after is None:
            return await EventFollower.at_end(self.client, self.ks)
        return EventFollower.after(self.client, self.ks, after)

    async def count_failure(self, client_ip: str, window_s: int) -> FailureCount:
        """Count one failed authentication in the client's fixed window (opened if none)."""
        key = self.ks.auth_failures(client_ip)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(key, 0, ex=window_s, nx=True)
            pipe.incr(key)
            pipe.ttl(key)
            _, count, ttl = await pipe.execute()
        return FailureCount(int(count), int(ttl))
