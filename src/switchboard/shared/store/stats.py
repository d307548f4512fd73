"""What the server says about itself, and batched reads of how far work has got.

`ServerStats` reads ``INFO``: the calls per command (``commandstats``, for Redis commands
per run), memory and the server's version; on a Redis Cluster, of every primary (the
calls and memory summed), as the store's keys may be on any of them. It also watches one
server's commands as they run (``MONITOR``, `Monitoring`: the bench's attribution of a
run's commands to its steps; never a product path). `ProgressReads`
answers "is the work done?" for many runs or sessions in one round trip each: a load
generator polls them while a burst runs, so they read the least that answers (``HMGET``
of two fields, ``XLEN``).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis import ConnectionPool, Redis
from redis.exceptions import RedisError, ResponseError

from switchboard.shared.store.cluster import info_of_primaries
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.run_records import TERMINAL

# The hash where kombu's Redis transport keeps messages delivered but not yet acked.
UNACKED = "unacked"
# The oldest Redis the store runs on: its scripts use ZADD with LT (Redis 6.2).
MIN_REDIS_VERSION = (6, 2)
MIN_REDIS_VERSION_TEXT = ".".join(map(str, MIN_REDIS_VERSION))


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a version such as ``6.0.16`` (or ``v=6.0.16`` in
    ``redis-server --version``); None when there is none."""
    match = re.search(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def too_old(version: str) -> bool:
    """The version is one the store cannot run on (older than `MIN_REDIS_VERSION`)."""
    parsed = parse_version(version)
    return parsed is not None and parsed < MIN_REDIS_VERSION


@dataclass(frozen=True)
class CommandCalls:
    """Calls per Redis command (``cmdstat_get`` → ``get``) at one moment."""

    calls: Mapping[str, int]

    def since(self, before: CommandCalls, *, ignore: Sequence[str] = ("info",)) -> dict[str, int]:
        """Calls made between ``before`` and this reading, per command (``ignore``d left
        out: by default the ``INFO`` that took the readings)."""
        out = {}
        for name, calls in self.calls.items():
            delta = calls - before.calls.get(name, 0)
            if delta and name not in ignore:
                out[name] = delta
        return out


class ServerStats:
    """The Redis servers' own counters (``INFO``): the one server's, or on a cluster every
    primary's (`cluster.info_of_primaries`)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    def command_calls(self) -> CommandCalls:
        """Calls per command since the servers started (``INFO commandstats``, summed)."""
        calls: Counter[str] = Counter()
        for info in self._infos("commandstats"):
            calls.update(
                {
                    name.removeprefix("cmdstat_"): int(stat["calls"])
                    for name, stat in info.items()
                    if name.startswith("cmdstat_")
                }
            )
        return CommandCalls(dict(calls))

    def memory_bytes(self) -> int:
        """Memory Redis holds for data and overhead (``used_memory``, summed)."""
        return sum(int(info["used_memory"]) for info in self._infos("memory"))

    def version(self) -> str:
        """The server's version (``redis_version``; on a cluster, the first primary's)."""
        return str(self._infos("server")[0]["redis_version"])

    def version_if_told(self) -> str | None:
        """The server's version, or None where ``INFO`` is refused (a managed Redis may
        rename or disable it)."""
        try:
            return self.version()
        except (ResponseError, KeyError):
            return None

    def monitor(self) -> Monitoring:
        """Watch the server's commands (`Monitoring`; a single server, not a cluster)."""
        return Monitoring(self.redis)

    def _infos(self, section: str) -> list[dict[str, Any]]:
        """``INFO section`` of every primary."""
        return info_of_primaries(self.redis, section)


@dataclass(frozen=True)
class Monitored:
    """One command as ``MONITOR`` showed it: who sent it (``lua`` for a command a script
    ran, else the client's address:port) and the command with its arguments."""

    client: str
    command: str

    @property
    def name(self) -> str:
        """The command's name, lower case (``evalsha``)."""
        return self.command.partition(" ")[0].lower()


class Monitoring:
    """Every command one server runs while in use (``with``), read by ``MONITOR`` on a
    connection and a thread of its own. MONITOR costs the server a copy of each command:
    for a few measured calls, never under load."""

    def __init__(self, redis: Redis) -> None:
        kwargs = dict(redis.connection_pool.connection_kwargs)
        kwargs["socket_timeout"] = None  # it waits for the next command however long
        self._redis = Redis(connection_pool=ConnectionPool(**kwargs))
        self._wake = redis
        self._seen: list[Monitored] = []
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="monitor", daemon=True)
        self._started = threading.Event()

    def __enter__(self) -> Monitoring:
        self._thread.start()
        self._started.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.ping()  # the watcher wakes on a command, then stops
        self._thread.join(5)
        self._redis.close()

    def commands(self) -> list[Monitored]:
        """The commands seen so far, in the order the server ran them."""
        return list(self._seen)

    def wait_quiet(self, quiet_s: float, timeout_s: float = 30.0) -> None:
        """Return once no command came for ``quiet_s`` (or ``timeout_s`` passed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and time.monotonic() - self._last < quiet_s:
            time.sleep(quiet_s / 4)

    def _watch(self) -> None:
        try:
            # redis-py's Monitor is untyped.
            with self._redis.monitor() as watching:  # type: ignore[no-untyped-call]
                self._started.set()
                for seen in watching.listen():
                    if self._stop.is_set():
                        return
                    self._last = time.monotonic()
                    port = seen["client_port"]
                    client = f"{seen['client_address']}:{port}" if port else seen["client_type"]
                    self._seen.append(Monitored(client, seen["command"]))
        except RedisError:
            self._started.set()  # the caller finds no commands rather than waiting


class ProgressReads:
    """Batched reads of how far work has got: run ends, transcript lengths, the backlog."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks

    def run_ends(self, run_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
        """The runs that have ended: run id → (terminal status, ``endedAt`` ms)."""
        pipe = self.redis.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hmget(self.ks.run(run_id), "status", "endedAt")
        ended = {}
        for run_id, (status, ended_at) in zip(run_ids, pipe.execute(), strict=True):
            if status is not None and status.decode() in TERMINAL:
                ended[run_id] = (status.decode(), int(ended_at or 0))
        return ended

    def transcript_lengths(self, session_keys: Sequence[str]) -> list[int]:
        """The number of messages in each session's transcript, in order."""
        pipe = self.redis.pipeline(transaction=False)
        for key in session_keys:
            pipe.xlen(self.ks.transcript(key))
        return [int(n) for n in pipe.execute()]

    def parked_runs(self) -> int:
        """How many runs are parked (waiting on another run, holding no worker thread)."""
        pipe = self.redis.pipeline(transaction=False)
        for group in self.ks.every_group():
            pipe.zcard(group.parked_runs)
        return sum(int(n) for n in pipe.execute())

    def backlog(self, queues: Sequence[str], broker: ProgressReads | None = None) -> int:
        """Work not yet done: messages queued on ``queues`` or unacked, lanes held (by a
        run queued, taken by a worker or running), parked runs, flow steps not yet run
        and outbox entries (0 when everything has settled). Lanes and steps count
        the messages a worker holds where the broker keeps no copy of them (ack emulation
        off, `workers.transport`). The queues are read on
        ``broker`` when the broker is another Redis than the state's (one round trip
        each), else with the rest in one."""
        if broker is not None:
            return broker.queued(queues) + self.unfinished()
        pipe = self.redis.pipeline(transaction=False)
        self._queue_reads(pipe, queues)
        self._unfinished_reads(pipe)
        return sum(int(n) for n in pipe.execute())

    def queued(self, queues: Sequence[str]) -> int:
        """Messages queued on ``queues`` or unacked (this Redis as the broker)."""
        pipe = self.redis.pipeline(transaction=False)
        self._queue_reads(pipe, queues)
        return sum(int(n) for n in pipe.execute())

    def unfinished(self) -> int:
        """Lanes held (a running run holds one), parked runs, flow steps not yet run,
        outbox entries."""
        pipe = self.redis.pipeline(transaction=False)
        self._unfinished_reads(pipe)
        return sum(int(n) for n in pipe.execute())

    def _queue_reads(self, pipe: Any, queues: Sequence[str]) -> None:
        for name in queues:
            pipe.llen(name)
        pipe.hlen(UNACKED)

    def _unfinished_reads(self, pipe: Any) -> None:
        for group in self.ks.every_group():
            pipe.zcard(group.lane_leases)
            pipe.zcard(group.pending_steps)
            pipe.zcard(group.outbox)
            pipe.zcard(group.parked_runs)

    def backlog_commands(self, queues: Sequence[str]) -> dict[str, int]:
        """The Redis commands one `backlog` sends, per command (to leave out of a count)."""
        return {"llen": len(queues), "hlen": 1, "zcard": 4 * self.ks.groups}
