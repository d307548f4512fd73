"""What tests read of the store's raw keys across its slot groups (`Keyspace.every_group`):
the events of every group's stream."""

from __future__ import annotations

import uuid
from typing import Any

from switchboard.shared.store import Store, codec, slot_groups
from switchboard.shared.store.codec import as_text


def events(store: Store, event_type: str | None = None) -> list[dict[str, Any]]:
    """Every event still in the streams (``{"type", **data}``), oldest first per group,
    the groups in order; only ``event_type``'s when given."""
    pipe = store.redis.pipeline(transaction=False)
    for group in store.ks.every_group():
        pipe.xrange(group.events)
    found = []
    for entries in pipe.execute():
        for _, fields in entries:
            decoded = codec.decode_hash(fields)
            if event_type is None or decoded["type"] == event_type:
                found.append({"type": decoded["type"], **codec.loads(decoded["data"])})
    return found


def index_members(store: Store, index: str) -> list[str]:
    """The members of one `GroupKeys` sorted set (``"deliveries_due"``…) in every group."""
    pipe = store.redis.pipeline(transaction=False)
    for group in store.ks.every_group():
        pipe.zrange(getattr(group, index), 0, -1)
    return [as_text(m) for rows in pipe.execute() for m in rows]


def id_beside(session_key: str, name: str) -> str:
    """A record id for a test to name by ``name`` (the same for the same name and session),
    made in the session's slot group as the product's ids are (`slot_groups.id_beside`)."""
    return slot_groups.id_beside(session_key, str(uuid.uuid5(_TEST_IDS, name)))


_TEST_IDS = uuid.UUID("8d1b9b6e-51b4-4a8e-9a43-0b8e2f6c1d77")
