"""Api heartbeats: each api process writes, every few seconds, that it is alive.

`switchboard check-health --all` lists them: an entry not renewed for a few intervals is
an api that stopped (crashed, killed, hung); a stopping api removes its own entry. Entries
older than ``API_FORGET_MS`` are dropped by the next heartbeat of any api, so the pods an
autoscaler removed do not stay listed for ever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from redis import Redis

from switchboard.shared.store.keyspace import Keyspace

# How often an api writes its heartbeat, and after how many missed ones it reads as stale.
API_HEARTBEAT_S = 2.0
API_STALE_INTERVALS = 3
# A heartbeat this old is forgotten (the api is gone, not merely late).
API_FORGET_MS = 10 * 60 * 1000


@dataclass(frozen=True)
class ApiBeat:
    """One api process as its last heartbeat described it."""

    api_id: str
    host: str
    pid: int
    url: str
    seen_ms: int


class ApiHeartbeats:
    """The `sb:apis` hash: api id → its last heartbeat."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks

    def beat(self, beat: ApiBeat) -> None:
        """Write ``beat`` and forget the entries older than API_FORGET_MS."""
        value = json.dumps(
            {"host": beat.host, "pid": beat.pid, "url": beat.url, "seen": beat.seen_ms}
        )
        self.redis.hset(self.ks.apis, beat.api_id, value)
        gone = [b.api_id for b in self.all() if beat.seen_ms - b.seen_ms > API_FORGET_MS]
        if gone:
            self.redis.hdel(self.ks.apis, *gone)

    def remove(self, api_id: str) -> None:
        """Drop an api's entry (it stops cleanly)."""
        self.redis.hdel(self.ks.apis, api_id)

    def all(self) -> list[ApiBeat]:
        """Every api heartbeat, by api id; unreadable entries are skipped."""
        raw: dict[bytes | str, bytes | str] = self.redis.hgetall(self.ks.apis)
        beats = []
        for field, value in raw.items():
            api_id = field.decode() if isinstance(field, bytes) else field
            try:
                data = json.loads(value)
                beats.append(
                    ApiBeat(
                        api_id,
                        str(data["host"]),
                        int(data["pid"]),
                        str(data["url"]),
                        int(data["seen"]),
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue
        return sorted(beats, key=lambda b: b.api_id)
