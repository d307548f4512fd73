"""The audit stream: one entry per call the api answered for a scoped token.

One capped Redis stream (``Keyspace.audit``, ~``AUDIT_MAXLEN`` entries); each entry names
the token id, the surface (``tools``, ``rpc``, ``mcp``, ``openai``, ``responses``, or the
path of a surface the token may not use), the tool or method, the session key it acted
as, the outcome (``ok``, ``refused`` when out of scope, ``error``, or the tool's own
``status`` such as ``forbidden``) and the HTTP status. The api writes it
(`AsyncAuditStore.record_use`, which also marks the token's last use); `switchboard audit`
reads it (`AuditStore.recent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis import Redis

from switchboard.shared.store import codec
from switchboard.shared.store.client import AsyncStoreClient
from switchboard.shared.store.keyspace import AUDIT_MAXLEN, Keyspace
from switchboard.shared.store.lua_scripts import load as load_lua


@dataclass(frozen=True)
class AuditEntry:
    """One audited call."""

    token_id: str
    surface: str
    outcome: str
    status: int
    at_ms: int
    tool: str | None = None
    session_key: str | None = None
    entry_id: str = ""

    def to_fields(self) -> dict[str, str]:
        """The stream entry's fields (absent values left out)."""
        fields = {
            "tokenId": self.token_id,
            "surface": self.surface,
            "tool": self.tool,
            "sessionKey": self.session_key,
            "outcome": self.outcome,
            "status": self.status,
            "ts": self.at_ms,
        }
        return {k: v for k, v in codec.text_fields(fields).items() if v is not None}

    @classmethod
    def from_fields(cls, entry_id: str, h: dict[str, str]) -> AuditEntry:
        """Build from a decoded stream entry."""
        return cls(
            token_id=h.get("tokenId", ""),
            surface=h.get("surface", ""),
            outcome=h.get("outcome", ""),
            status=codec.as_int(h.get("status")) or 0,
            at_ms=codec.as_int(h.get("ts")) or 0,
            tool=h.get("tool") or None,
            session_key=h.get("sessionKey") or None,
            entry_id=entry_id,
        )

    def as_json(self) -> dict[str, Any]:
        """The entry as a JSON object (`switchboard audit --json`)."""
        return {
            "id": self.entry_id,
            "ts": self.at_ms,
            "tokenId": self.token_id,
            "surface": self.surface,
            "tool": self.tool,
            "sessionKey": self.session_key,
            "outcome": self.outcome,
            "status": self.status,
        }


class AuditStore:
    """The audit stream's reader (the CLI)."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks

    def recent(self, count: int, token_id: str | None = None) -> list[AuditEntry]:
        """The newest ``count`` entries (of one token, if given), oldest first."""
        entries: list[AuditEntry] = []
        cursor = "+"
        page_size = max(count, 100)
        while len(entries) < count:
            page: Any = self.redis.xrevrange(self.ks.audit, max=cursor, count=page_size)
            for raw_id, fields in page or []:
                entry = AuditEntry.from_fields(codec.as_text(raw_id), codec.decode_hash(fields))
                if token_id is None or entry.token_id == token_id:
                    entries.append(entry)
            if token_id is None or not page or len(page) < page_size:
                break
            cursor = "(" + codec.as_text(page[-1][0])
        return list(reversed(entries[:count]))


class AsyncAuditStore:
    """The api's audit writer, on its async client."""

    def __init__(
        self, client: AsyncStoreClient, ks: Keyspace, *, maxlen: int = AUDIT_MAXLEN
    ) -> None:
        self.client = client
        self.ks = ks
        self.maxlen = maxlen
        self._touch = client.register_script(load_lua("token_touch").source)

    async def record_use(self, entry: AuditEntry) -> None:
        """Append the entry and mark the token's last use, in one round trip."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xadd(
                self.ks.audit,
                entry.to_fields(),  # type: ignore[arg-type]
                maxlen=self.maxlen,
                approximate=True,
            )
            await self._touch(
                keys=[self.ks.api_token(entry.token_id)], args=[entry.at_ms], client=pipe
            )
            await pipe.execute()
