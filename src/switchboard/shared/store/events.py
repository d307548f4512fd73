"""The events stream: what the console and ``GET /events`` follow.

One capped Redis stream (``Keyspace.events``); each entry is ``{type, data}`` with ``data``
a JSON object that names its ``sessionKey``. Types: ``run.started``, ``run.parked``,
``run.ended`` (its messages are in the transcript by then), ``delivery`` (a webchat
message) and ``delivery.settled`` (a delivery's final status). The stream is an
observation channel, not a source of truth: publishing is best effort and never fails
the step that publishes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from redis import Redis

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store import codec
from switchboard.shared.store.keyspace import EVENTS_MAXLEN, Keyspace
from switchboard.shared.store.runs import RunRecord, now_ms

log = logging.getLogger("switchboard.events")

# How much of a reply or error an event carries (the transcript has the rest).
_TEXT_CHARS = 500


class EventStore:
    """The events stream's writer (readers follow it through the api's `AsyncStore`)."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks

    def publish(self, event_type: str, data: Mapping[str, Any]) -> str | None:
        """Append one event; returns its stream id, None when Redis refused it."""
        fields = {"type": event_type, "data": codec.dumps({**data, "ts": now_ms()})}
        try:
            entry_id = self.redis.xadd(
                self._stream(data),
                fields,  # type: ignore[arg-type]
                maxlen=EVENTS_MAXLEN,
                approximate=True,
            )
        except StoreUnavailable as exc:
            log.warning("event %s not published: %s", event_type, exc.fields.get("detail", exc))
            return None
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    def _stream(self, data: Mapping[str, Any]) -> str:
        """The stream an event goes to: its session's group's (the home group's when it
        names none), where the scripts' events of that session go too."""
        session_key = data.get("sessionKey")
        group = self.ks.beside(session_key) if isinstance(session_key, str) else self.ks.home
        return group.events


def run_event(rec: RunRecord, **extra: Any) -> dict[str, Any]:
    """The data of a ``run.*`` event: ids, kind, flow or spawn it belongs to, and ``extra``."""
    data: dict[str, Any] = {"runId": rec.run_id, "sessionKey": rec.session_key, "kind": rec.kind}
    for name in ("flowId", "spawnId", "batchId"):
        if rec.meta.get(name):
            data[name] = rec.meta[name]
    for name, value in extra.items():
        if value is None:
            continue
        data[name] = value[:_TEXT_CHARS] if isinstance(value, str) else value
    return data


def decode_entry(
    entry_id: bytes | str, fields: Mapping[bytes | str, bytes | str]
) -> tuple[str, str, dict[str, Any]]:
    """A stream entry as ``(id, type, data)``; unreadable data decodes to ``{}``."""
    raw_type = fields.get(b"type") or fields.get("type") or b"event"
    raw_data = fields.get(b"data") or fields.get("data")
    try:
        data = codec.loads(raw_data) if raw_data else {}
    except ValueError:
        data = {}
    text_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    text_type = raw_type.decode() if isinstance(raw_type, bytes) else str(raw_type)
    return text_id, text_type, data if isinstance(data, dict) else {}
