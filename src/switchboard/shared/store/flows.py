"""Reply-back flow records (``sessions_send``): the flow hashes and each session's index.

One hash per flow (``Keyspace.flow``), listed in the index of each session it concerns
(``Keyspace.session_flows``). A flow is usually first written with its primary run's start
(a `LinkRecord` in ``RunStore.start``, or on its own by ``RunStore.write_link_record``,
the same write); this store advances it with a compare-and-set (``lua/advance_link.lua``),
sets a field once, and reads the hashes and indexes. What a flow's fields
mean is ``shared.flows.a2a_flow``'s business.
"""

from __future__ import annotations

from redis import Redis

from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts
from switchboard.shared.store.run_records import LinkAdvance


class FlowStore:
    """Flow hashes and the per-session flow indexes."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._lua = LuaScripts(redis)

    def advance(self, flow_id: str, cas: LinkAdvance) -> bool:
        """Write ``cas.fields`` if the flow is still at ``cas.status`` (and ``cas.turn``);
        False when it moved on."""
        res = self._lua["advance_link"](
            link=self.ks.flow(flow_id),
            status=cas.status,
            turn=cas.turn,
            fields=codec.fields_json(cas.fields),
            ttl_s=cas.ttl_s,
        )
        return bool(int(res))

    def record_once(self, flow_id: str, name: str, value: str) -> str:
        """Set a field unless it is set; returns the value that holds (first writer wins)."""
        key = self.ks.flow(flow_id)
        if self.redis.hsetnx(key, name, value):
            return value
        return as_text(self.redis.hget(key, name))

    def read_hash(self, key: str) -> dict[str, str]:
        """A record hash a flow step reads (a flow, spawn or session), decoded; {} when
        absent."""
        return codec.decode_hash(self.redis.hgetall(key))

    def recent_ids(self, session_key: str, limit: int) -> list[str]:
        """The newest ``limit`` flow ids a session requested or was sent, newest first."""
        rows = self.redis.zrevrange(self.ks.session_flows(session_key), 0, limit - 1)
        return [as_text(v) for v in rows]
