"""Following the events streams from the api's event loop: one stream, or one per slot group.

Events are appended to the stream of the slot group of the session they name (in the
step that makes them, so an event is there exactly when its change is), so with several
groups there are several streams. `EventFollower` reads them as one:

- one group: the stream's own entry ids are the cursor, and a read blocks on the stream
  (``XREAD BLOCK``), as a reader of one Redis stream does;
- several: an event's id is its entry id and its group (``<ms>-<seq>-<group>``), events
  come merged in that order, the follower keeps where it is in every stream (so nothing
  is skipped or repeated while it follows), and an idle follower reads them all again
  every `POLL_S` (a blocking read covers one slot only). Resuming from an id starts each
  stream where that id falls in the merged order: exact while the nodes' clocks agree
  (stream ids are each server's time), otherwise an event stamped earlier than the
  resume point by a node whose clock lags is not sent again.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Sequence
from typing import Any

from switchboard.shared.store.client import AsyncStoreClient
from switchboard.shared.store.events import decode_entry
from switchboard.shared.store.keyspace import Keyspace

# One event as read from the stream: (id, type, data).
Event = tuple[str, str, dict[str, Any]]

# How often an idle follower of several streams reads them again (seconds).
POLL_S = 0.25
# The greatest sequence number of a stream id.
_MAX_SEQ = 2**64 - 1
_START = "0-0"


def _ms_seq(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _just_before(ms: int, seq: int) -> str:
    """The stream id right before ``ms-seq`` (XREAD returns ids after the one given)."""
    if seq > 0:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{_MAX_SEQ}" if ms > 0 else _START


class EventFollower:
    """Where one reader is in the events streams (see the module), and its next reads."""

    def __init__(self, client: AsyncStoreClient, ks: Keyspace, positions: Sequence[str]) -> None:
        self.client = client
        self.streams = [group.events for group in ks.every_group()]
        self.positions = list(positions)  # per group: the last entry id read
        self.cursor = self._id_of(self._newest(), self.positions)

    @classmethod
    async def at_end(cls, client: AsyncStoreClient, ks: Keyspace) -> EventFollower:
        """A follower of what is appended from now on."""
        pipe = client.pipeline(transaction=False)
        for group in ks.every_group():
            pipe.xrevrange(group.events, count=1)
        newest = await pipe.execute()
        return cls(client, ks, [_text(rows[0][0]) if rows else _START for rows in newest])

    @classmethod
    def after(cls, client: AsyncStoreClient, ks: Keyspace, cursor: str) -> EventFollower:
        """A follower of what comes after the event id ``cursor`` (an id it gave)."""
        if ks.groups == 1:
            return cls(client, ks, [cursor])
        ms_text, _, rest = cursor.partition("-")
        seq_text, _, group_text = rest.partition("-")
        ms, seq, at = int(ms_text), int(seq_text or 0), int(group_text or 0)
        # Merged order is (ms, seq, group): a group before the cursor's has had ms-seq
        # itself, a group after it has not.
        positions = [f"{ms}-{seq}" if g <= at else _just_before(ms, seq) for g in range(ks.groups)]
        follower = cls(client, ks, positions)
        follower.cursor = cursor
        return follower

    def _newest(self) -> int:
        """The group whose position is furthest on in the merged order."""
        keys = [(*_ms_seq(p), g) for g, p in enumerate(self.positions)]
        return max(keys)[2]

    def _id_of(self, group: int, positions: Sequence[str]) -> str:
        """The public id of the entry at ``positions[group]``."""
        if len(positions) == 1:
            return positions[0]
        return f"{positions[group]}-{group}"

    async def next(self, *, count: int, block_ms: int) -> list[Event]:
        """Up to ``count`` events after the cursor, oldest first; waits up to
        ``block_ms`` (one stream) or `POLL_S` (several) when there are none."""
        if len(self.streams) == 1:
            reply: Any = await self.client.xread(
                {self.streams[0]: self.positions[0]}, count=count, block=block_ms
            )
            entries = _entries(reply)
            events = [decode_entry(entry_id, fields) for entry_id, fields in entries]
            if events:
                self.positions[0] = self.cursor = events[-1][0]
            return events
        events = await self._read_all(count)
        if not events:
            await asyncio.sleep(min(block_ms / 1000, POLL_S))
        return events

    async def _read_all(self, count: int) -> list[Event]:
        """One read of every stream, merged, at most ``count`` events."""
        pipe = self.client.pipeline(transaction=False)
        for stream, position in zip(self.streams, self.positions, strict=True):
            pipe.xread({stream: position}, count=count)
        per_group = []
        for group, reply in enumerate(await pipe.execute()):
            per_group.append(
                [(*_ms_seq(_text(eid)), group, eid, fields) for eid, fields in _entries(reply)]
            )
        merged = list(heapq.merge(*per_group))[:count]
        events: list[Event] = []
        for _, _, group, entry_id, fields in merged:
            self.positions[group] = _text(entry_id)
            _, event_type, data = decode_entry(entry_id, fields)
            self.cursor = self._id_of(group, self.positions)
            events.append((self.cursor, event_type, data))
        return events


def _entries(reply: Any) -> list[Any]:
    """The entries of one stream's XREAD reply (RESP2 ``[[stream, entries]]``, RESP3
    ``{stream: entries}``, or none)."""
    if not reply:
        return []
    return list(next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
