"""Redis model: sessions, transcripts, runs and session lanes, behind one facade."""

from __future__ import annotations

from functools import partial

from redis import Redis

from switchboard.shared import keys as sk
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.runs import RunStore
from switchboard.shared.store.sessions import SessionStore
from switchboard.shared.store.transcripts import TranscriptStore

__all__ = ["Keyspace", "RunStore", "SessionStore", "Store", "TranscriptStore"]


class Store:
    """Everything the domain keeps in Redis, sharing one client and one key prefix."""

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str = "sb:",
        main_key: str = "main",
        scope: str = "per-sender",
        retention_s: int = 24 * 3600,
        max_attempts: int = 3,
        lease_s: int = 30,
    ) -> None:
        self.redis = redis
        self.ks = Keyspace(prefix)
        kind_of = partial(sk.session_kind, main_key=main_key, scope=scope)
        self.sessions = SessionStore(redis, self.ks, kind_of)
        self.transcripts = TranscriptStore(redis, self.ks)
        self.runs = RunStore(
            redis,
            self.ks,
            retention_s=retention_s,
            max_attempts=max_attempts,
            kind_of=kind_of,
            lease_s=lease_s,
        )
