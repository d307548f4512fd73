"""Scoped api tokens: created and listed by the CLI, looked up by the api on every request.

A token reads ``sbt_<id>_<secret>``: the id names its hash (``Keyspace.api_token``), the
secret is 32 random bytes of which only the sha256 is kept, so the token is shown once
(at creation) and never again. A token acts for one agent, optionally one session of it,
optionally a set of tools (`TokenRecord`). Revoking deletes the hash: every api looks the
token up on each request (no cache), so the next request anywhere is refused. A ``--ttl``
is the hash's Redis expiry, and the record's ``expiresAt`` is checked as well.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis import Redis

from switchboard.shared.store import codec
from switchboard.shared.store.client import AsyncStoreClient
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.runs import now_ms

TOKEN_PREFIX = "sbt_"
_TOKEN = re.compile(r"sbt_([0-9a-f]{16})_([A-Za-z0-9_-]{20,128})")
_ID = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class TokenRecord:
    """One scoped token as stored (without its secret)."""

    token_id: str
    agent_id: str
    secret_sha256: str = ""
    session_key: str | None = None
    tools: frozenset[str] | None = None  # None: every tool the session is offered
    label: str | None = None
    created_at_ms: int = 0
    last_used_at_ms: int | None = None
    expires_at_ms: int | None = None

    def to_hash(self) -> dict[str, str]:
        """The hash fields (absent values left out)."""
        fields = {
            "hash": self.secret_sha256,
            "agentId": self.agent_id,
            "sessionKey": self.session_key,
            "tools": sorted(self.tools) if self.tools is not None else None,
            "label": self.label,
            "createdAt": self.created_at_ms,
            "expiresAt": self.expires_at_ms,
        }
        return {k: v for k, v in codec.text_fields(fields).items() if v is not None}

    @classmethod
    def from_hash(cls, token_id: str, h: Mapping[str, str]) -> TokenRecord:
        """Build from a decoded HGETALL reply."""
        tools = codec.as_json(h.get("tools"), None)
        return cls(
            token_id=token_id,
            agent_id=h.get("agentId", ""),
            secret_sha256=h.get("hash", ""),
            session_key=h.get("sessionKey") or None,
            tools=frozenset(tools) if isinstance(tools, list) else None,
            label=h.get("label") or None,
            created_at_ms=codec.as_int(h.get("createdAt")) or 0,
            last_used_at_ms=codec.as_int(h.get("lastUsed")),
            expires_at_ms=codec.as_int(h.get("expiresAt")),
        )

    def expired(self, at_ms: int) -> bool:
        """Whether the token's lifetime has passed at ``at_ms``."""
        return self.expires_at_ms is not None and at_ms >= self.expires_at_ms


@dataclass(frozen=True)
class IssuedToken:
    """A token just created: the secret text (shown once) and its record."""

    token: str
    record: TokenRecord


def split_token(token: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed scoped token, else None (no lookup is made)."""
    match = _TOKEN.fullmatch(token.strip())
    return (match.group(1), match.group(2)) if match else None


def secret_matches(record: TokenRecord, secret: str) -> bool:
    """Whether ``secret`` hashes to the record's hash (constant-time)."""
    digest = hashlib.sha256(secret.encode()).hexdigest()
    return bool(record.secret_sha256) and hmac.compare_digest(digest, record.secret_sha256)


class TokenStore:
    """Scoped tokens for the CLI: create, list, revoke (the api reads `AsyncTokenStore`)."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks

    def create(
        self,
        agent_id: str,
        *,
        session_key: str | None = None,
        tools: Iterable[str] | None = None,
        label: str | None = None,
        ttl_s: int | None = None,
    ) -> IssuedToken:
        """A new token (its secret returned once, only its sha256 stored)."""
        token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        created = now_ms()
        record = TokenRecord(
            token_id=token_id,
            agent_id=agent_id,
            secret_sha256=hashlib.sha256(secret.encode()).hexdigest(),
            session_key=session_key,
            tools=frozenset(tools) if tools is not None else None,
            label=label,
            created_at_ms=created,
            expires_at_ms=created + ttl_s * 1000 if ttl_s else None,
        )
        key = self.ks.api_token(token_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping=record.to_hash())  # type: ignore[arg-type]
        if ttl_s:
            pipe.expire(key, ttl_s)
        pipe.zadd(self.ks.api_tokens, {token_id: created})
        pipe.execute()
        return IssuedToken(f"{TOKEN_PREFIX}{token_id}_{secret}", record)

    def get(self, token_id: str) -> TokenRecord | None:
        """The token's record, or None when unknown, revoked or expired."""
        if not _ID.fullmatch(token_id):
            return None
        raw = self.redis.hgetall(self.ks.api_token(token_id))
        record = TokenRecord.from_hash(token_id, codec.decode_hash(raw)) if raw else None
        return None if record is None or record.expired(now_ms()) else record

    def list(self) -> list[TokenRecord]:
        """Every live token, oldest first; ids whose hash is gone are dropped from the index."""
        ids = [codec.as_text(i) for i in self.redis.zrange(self.ks.api_tokens, 0, -1)]
        pipe = self.redis.pipeline(transaction=False)
        for token_id in ids:
            pipe.hgetall(self.ks.api_token(token_id))
        found, gone = [], []
        at_ms = now_ms()
        for token_id, raw in zip(ids, pipe.execute(), strict=True):
            record = TokenRecord.from_hash(token_id, codec.decode_hash(raw)) if raw else None
            if record is None or record.expired(at_ms):
                gone.append(token_id)
            else:
                found.append(record)
        if gone:
            self.redis.zrem(self.ks.api_tokens, *gone)
        return found

    def revoke(self, token_id: str) -> bool:
        """End the token at once; False when there was no such token."""
        if not _ID.fullmatch(token_id):
            return False
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.ks.api_token(token_id))
        pipe.zrem(self.ks.api_tokens, token_id)
        deleted, _ = pipe.execute()
        return bool(deleted)


class AsyncTokenStore:
    """The api's per-request token lookup and last-used mark, on its async client."""

    def __init__(self, client: AsyncStoreClient, ks: Keyspace) -> None:
        self.client = client
        self.ks = ks

    async def verify(self, token: str) -> TokenRecord | None:
        """The record of a live token whose secret matches, else None (one HGETALL)."""
        parts = split_token(token)
        if parts is None:
            return None
        token_id, secret = parts
        raw: Any = await self.client.hgetall(self.ks.api_token(token_id))
        if not raw:
            return None
        record = TokenRecord.from_hash(token_id, codec.decode_hash(raw))
        if record.expired(now_ms()) or not secret_matches(record, secret):
            return None
        return record
