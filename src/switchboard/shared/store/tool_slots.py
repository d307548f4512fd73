"""Tool-server slots: a fleet-wide semaphore with leases, one per tool server.

A server's ``maxConcurrent`` caps the calls in flight to it across every worker. Each call
holds a slot while it runs: a member of the server's sorted set (`Keyspace.tool_slots`),
its holder id scored by when its lease ends, on Redis's clock (``TIME`` in the scripts, so
workers' clocks do not matter). A call that outlives a third of its lease renews it; a
worker that dies holding slots renews nothing, and the next acquire drops the lapsed
leases, so their slots come back within one lease.

Slots are shared fairly between the processes whose calls wait: such a process is in the
server's line (`Keyspace.tool_slot_queue`), and a caller gets a slot only when more are
free than processes ahead of it, so a worker that gives its slots back and asks again at
once cannot keep them from another that waits (tool_slot_acquire.lua says how).

A server's keys share its slot group, in KEYS of every script: a Redis Cluster routes each
call to the primary of that slot. Waiting for a slot is not done here
(`runtime.slot_limiter`): an acquire answers at once, taken or not.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis

from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts

# A process in a server's line that has not asked for this long is dropped (ms).
QUEUE_MS = 3000


@dataclass(frozen=True)
class Acquired:
    """What an acquire answered: whether the slot was taken, how many are held, and how
    many processes are ahead of the caller in line (0 when taken)."""

    taken: bool
    held: int
    ahead: int = 0


class ToolSlotStore:
    """The slots of every tool server (``sb:tslots:<server>``)."""

    def __init__(self, redis: Redis, ks: Keyspace, *, queue_ms: int = QUEUE_MS) -> None:
        self.redis = redis
        self.ks = ks
        self.queue_ms = queue_ms
        self._lua = LuaScripts(redis)

    def acquire(
        self,
        server: str,
        holder: str,
        limit: int,
        lease_ms: int,
        *,
        proc: str = "",
        stay: bool = False,
    ) -> Acquired:
        """Take a slot of ``server`` for ``holder`` under a lease of ``lease_ms``, unless
        ``limit`` holders hold one or the free ones go to processes ahead of ``proc`` in
        line (lapsed leases dropped first). Refused, ``proc`` waits in line; granted, it
        goes to the back of the line when it has more calls waiting (``stay``), else it
        leaves it. Without ``proc`` the caller asks once, behind the line, never in it."""
        taken, held, ahead = self._lua["tool_slot_acquire"](
            slots=self.ks.tool_slots(server),
            queue=self.ks.tool_slot_queue(server),
            seen=self.ks.tool_slot_seen(server),
            holder=holder,
            proc=proc,
            limit=limit,
            lease_ms=lease_ms,
            stay=int(stay),
            queue_ms=self.queue_ms,
        )
        return Acquired(bool(int(taken)), int(held), int(ahead))

    def leave(self, server: str, proc: str) -> bool:
        """Take ``proc`` out of ``server``'s line (its calls stopped waiting)."""
        res = self._lua["tool_slot_leave"](
            queue=self.ks.tool_slot_queue(server), seen=self.ks.tool_slot_seen(server), proc=proc
        )
        return bool(int(res))

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
