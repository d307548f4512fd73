"""The api's async store: what the event loop reads from Redis without a thread.

`AsyncStore` holds one async client (`client.AsyncStoreClient`, so a Redis error arrives as
`StoreUnavailable`) and offers what the api needs on its loop: the run waiter's reads and
subscription (`run_waiter`), the events stream (`events_after`, `events_end`), the auth
gate's lockout counts (`locked_ttl`, `count_failure`) and a readiness `ping`. Each api part
makes its own, because each needs its own socket timeout (a blocking stream read waits
longer than a lockout check may).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from switchboard.shared.store.client import AsyncStoreClient, connect_async
from switchboard.shared.store.events import decode_entry
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.waiter import RunWaiter

# One event as read from the stream: (stream id, type, data).
Event = tuple[str, str, dict[str, Any]]


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

    async def events_after(self, cursor: str, *, count: int, block_ms: int) -> list[Event]:
        """Up to ``count`` events after ``cursor``, waiting up to ``block_ms`` for one."""
        reply: Any = await self.client.xread({self.ks.events: cursor}, count=count, block=block_ms)
        if not reply:
            return []
        # RESP2 answers [[stream, entries]], RESP3 {stream: entries}.
        entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        return [decode_entry(entry_id, fields) for entry_id, fields in entries]

    async def events_end(self) -> str:
        """The id of the newest event (new ones come after it); ``0-0`` for none."""
        newest = await self.client.xrevrange(self.ks.events, count=1)
        if not newest:
            return "0-0"
        entry_id = newest[0][0]
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    async def locked_ttl(self, client_ip: str, max_failures: int) -> int | None:
        """The TTL of the client's failure window once it holds ``max_failures`` or more
        failures; None while it holds fewer (one read, two only when locked)."""
        key = self.ks.auth_failures(client_ip)
        count = await self.client.get(key)
        if count is None or int(count) < max_failures:
            return None
        return int(await self.client.ttl(key))

    async def count_failure(self, client_ip: str, window_s: int) -> FailureCount:
        """Count one failed authentication in the client's fixed window (opened if none)."""
        key = self.ks.auth_failures(client_ip)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(key, 0, ex=window_s, nx=True)
            pipe.incr(key)
            pipe.ttl(key)
            _, count, ttl = await pipe.execute()
        return FailureCount(int(count), int(ttl))
