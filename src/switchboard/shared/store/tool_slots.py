"""Tool-server slots: a fleet-wide semaphore with leases, one per tool server.

A server's ``maxConcurrent`` caps the calls in flight to it across every worker. Each call
holds a slot while it runs: a member of the server's sorted set (`Keyspace.tool_slots`),
its holder id scored by when its lease ends, on Redis's clock (``TIME`` in the scripts, so
workers' clocks do not matter). A call that outlives a third of its lease renews it; a
worker that dies holding slots renews nothing, and the next acquire drops the lapsed
leases, so their slots come back within one lease.

One key per server, in KEYS of every script: a Redis Cluster routes each call to the
primary of that key's slot. Waiting for a slot is not done here (`runtime.tool_limits`):
an acquire answers at once, taken or not.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis

from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts


@dataclass(frozen=True)
class Acquired:
    """What an acquire answered: whether the slot was taken, and how many are held."""

    taken: bool
    held: int


class ToolSlotStore:
    """The slots of every tool server (``sb:tslots:<server>``)."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._lua = LuaScripts(redis)

    def acquire(self, server: str, holder: str, limit: int, lease_ms: int) -> Acquired:
        """Take a slot of ``server`` for ``holder`` under a lease of ``lease_ms``, unless
        ``limit`` holders hold one (lapsed leases dropped first)."""
        taken, held = self._lua["tool_slot_acquire"](
            slots=self.ks.tool_slots(server), holder=holder, limit=limit, lease_ms=lease_ms
        )
        return Acquired(bool(int(taken)), int(held))

    def renew(self, server: str, holder: str, lease_ms: int) -> bool:
        """Push ``holder``'s lease on to ``lease_ms`` from now; False when it had lapsed
        (the slot may be another call's by now: it is not taken back)."""
        res = self._lua["tool_slot_renew"](
            slots=self.ks.tool_slots(server), holder=holder, lease_ms=lease_ms
        )
        return bool(int(res))

    def release(self, server: str, holder: str) -> bool:
        """Give ``holder``'s slot back; False when its lease had lapsed already."""
        res = self._lua["tool_slot_release"](slots=self.ks.tool_slots(server), holder=holder)
        return bool(int(res))

    def held(self, server: str) -> int:
        """How many calls hold a slot of ``server`` under a live lease."""
        return int(self._lua["tool_slot_count"](slots=self.ks.tool_slots(server)))
