"""OpenAI Responses API records: what a response id names.

A response is one run in one session (``resp_<runId>``); its record keeps what the run
does not: the agent it was asked of, the response it continued (`previous_response_id`),
the request's instructions and metadata, whether it runs in the background, and, for an
answer given without a run (an owner's `/send` command), that answer. The output, status
and usage are the run's (`RunStore`). A record expires ``RESPONSE_TTL_S`` after it is
written, so a conversation can be continued long after its runs' records are gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from redis import Redis

from switchboard.shared.store import codec
from switchboard.shared.store.keyspace import RESPONSE_TTL_S, Keyspace


@dataclass(frozen=True)
class ResponseRecord:
    """One response as stored."""

    response_id: str
    session_key: str
    agent_id: str
    created_at_ms: int
    run_id: str | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    background: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)
    # The answer of a message that started no run (an owner's `/send on|off|inherit`).
    reply: str | None = None

    def to_hash(self) -> dict[str, str]:
        """The hash fields (absent values left out)."""
        fields = {
            "sessionKey": self.session_key,
            "agentId": self.agent_id,
            "createdAt": self.created_at_ms,
            "runId": self.run_id,
            "previousResponseId": self.previous_response_id,
            "instructions": self.instructions,
            "background": self.background,
            "metadata": dict(self.metadata) or None,
            "reply": self.reply,
        }
        return {k: v for k, v in codec.text_fields(fields).items() if v is not None}

    @classmethod
    def from_hash(cls, response_id: str, h: Mapping[str, str]) -> ResponseRecord:
        """Build from a decoded HGETALL reply."""
        return cls(
            response_id=response_id,
            session_key=h.get("sessionKey", ""),
            agent_id=h.get("agentId", ""),
            created_at_ms=codec.as_int(h.get("createdAt")) or 0,
            run_id=h.get("runId") or None,
            previous_response_id=h.get("previousResponseId") or None,
            instructions=h.get("instructions"),
            background=bool(codec.as_bool(h.get("background"))),
            metadata=codec.as_json(h.get("metadata"), {}),
            reply=h.get("reply"),
        )


class ResponseStore:
    """Response records (``Keyspace.response``), each expiring ``ttl_s`` after its write."""

    def __init__(self, redis: Redis, ks: Keyspace, *, ttl_s: int = RESPONSE_TTL_S) -> None:
        self.redis = redis
        self.ks = ks
        self.ttl_s = ttl_s

    def put(self, rec: ResponseRecord) -> None:
        """Write the record (replacing one of the same id) with its TTL, in one step."""
        key = self.ks.response(rec.response_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, mapping=rec.to_hash())  # type: ignore[arg-type]
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def get(self, response_id: str) -> ResponseRecord | None:
        """The record, or None when unknown or expired."""
        raw = self.redis.hgetall(self.ks.response(response_id))
        return ResponseRecord.from_hash(response_id, codec.decode_hash(raw)) if raw else None
