"""Acknowledged writes: WAIT for replicas before a write's answer goes back.

Acknowledged writes (`Durability`, off unless ``SWITCHBOARD_REDIS_WAIT_REPLICAS`` is set):
Redis replicates asynchronously, so a write the primary answered can die with it in a
failover. With ``replicas`` set, each acknowledged write (a script named in
`ACKNOWLEDGED_SCRIPTS`: a run's accept, its end, a transcript append) is followed on the
same connection by ``WAIT replicas timeout_ms`` before its answer goes back: a single call
goes out as a non-transactional pipeline of EVALSHA + WAIT (one round trip); a pipeline
that queued one gets WAIT at its end (after EXEC for a transaction). WAIT counts the
connection's own writes, so it must be that connection. When fewer replicas have it within
the timeout the write stands on the primary (it cannot be taken back), and then:

- a run's accept made on its own (`REFUSED_WHEN_SHORT`) raises `NotReplicated`, a
  `StoreUnavailable`: the api answers 503 with Retry-After and the client was told nothing.
  A retry with the same idempotency key answers the same run; without one it may start a
  second run (the first stands unless a failover takes it). This is what closes a planned
  failover's window, where the old primary takes writes its replicas never see.
- anything else (a run's end, an append, a spawn's pipeline) logs a WARNING (at most one
  per `SHORT_LOG_EVERY_S`, with the count since) and goes on: a worker has no client to
  refuse, and a run whose end a failover loses is run again once its lease lapses.

docs/operations.md ("Replication and acknowledged writes") says more.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any

from redis.exceptions import NoScriptError

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.lua_scripts import load as load_lua
from switchboard.shared.store.redis_errors import unavailable

log = logging.getLogger("switchboard.store")

# The writes a client is told about, made durable on replicas when `Durability` is on: a
# run's accept (recorded with its session, or on its own), its end (with the messages it
# appends) and a transcript append outside a run.
ACKNOWLEDGED_SCRIPTS = ("start_run", "submit_run", "finish_run", "transcript_append")
# Of those, the ones whose shortfall is refused (`NotReplicated`) when run on their own.
REFUSED_WHEN_SHORT = ("start_run", "submit_run")
# At most one WARNING per this many seconds for writes that WAIT found short of replicas.
SHORT_LOG_EVERY_S = 10.0


def _script_sha(name: str) -> str:
    return hashlib.sha1(load_lua(name).source.encode()).hexdigest()


class NotReplicated(StoreUnavailable):
    """A run's accept is on the primary but WAIT found fewer replicas than asked in time:
    the client is answered 503 (retry, with the same idempotency key)."""


class Durability:
    """How many replicas must hold an acknowledged write before its answer (``replicas``,
    0: off) and how long WAIT may take for them (``timeout_ms``): the store client's one
    seam for it (see the module's docstring). Counts the writes WAIT found short."""

    def __init__(self, replicas: int = 0, timeout_ms: int = 1000) -> None:
        if replicas < 0 or (replicas and timeout_ms < 1):
            raise ValueError("replicas >= 0 and, with replicas, a timeout of 1 ms or more")
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self.acknowledged_shas = frozenset(_script_sha(n) for n in ACKNOWLEDGED_SCRIPTS)
        self.refused_shas = frozenset(_script_sha(n) for n in REFUSED_WHEN_SHORT)
        self.short = 0  # writes that reached fewer replicas than asked, since start
        self.refused = 0  # of those, the accepts refused (`NotReplicated`)
        self._lock = threading.Lock()
        self._short_unlogged = 0
        self._logged_at = float("-inf")

    def acknowledged(self, args: tuple[Any, ...]) -> bool:
        """Whether the command ``args`` is an acknowledged write to confirm (never when off)."""
        return bool(
            self.replicas
            and len(args) > 1
            and args[0] == "EVALSHA"
            and str(args[1]) in self.acknowledged_shas
        )

    def refuses(self, args: tuple[Any, ...]) -> bool:
        """Whether a shortfall of the acknowledged write ``args`` is refused on its own."""
        return str(args[1]) in self.refused_shas

    def wait_args(self) -> tuple[Any, ...]:
        """The WAIT command that confirms the connection's writes."""
        return ("WAIT", self.replicas, self.timeout_ms)

    def confirmed(self, reply: Any, *, refuse: bool = False) -> None:
        """Take WAIT's reply (the replicas that have the writes, or its error): fewer than
        asked are counted, then refused (`NotReplicated`) with ``refuse`` or logged; the
        write stands either way."""
        acked = reply if isinstance(reply, int) else -1
        if acked >= self.replicas:
            return
        shown = f"{acked} replicas" if acked >= 0 else f"an error ({reply})"
        with self._lock:
            self.short += 1
            if refuse:
                self.refused += 1
            else:
                self._short_unlogged += 1
            now = time.monotonic()
            if refuse or now - self._logged_at < SHORT_LOG_EVERY_S:
                count = 0
            else:
                count, self._short_unlogged, self._logged_at = self._short_unlogged, 0, now
        if refuse:
            raise NotReplicated(
                f"the write reached {shown} within {self.timeout_ms} ms, not the "
                f"{self.replicas} SWITCHBOARD_REDIS_WAIT_REPLICAS asks for"
            )
        if count:
            log.warning(
                "%d acknowledged writes reached fewer than %d replicas within %d ms (%s on "
                "the last): they stand on the primary only, and a failover may lose them",
                count,
                self.replicas,
                self.timeout_ms,
                shown,
            )


def acknowledged_call(client: Any, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    """Run the acknowledged write ``args`` on the store client ``client`` with WAIT after
    it, in one round trip (a non-transactional pipeline); a shortfall of an accept is
    refused (`NotReplicated`)."""
    pipe = client.pipeline(transaction=False)
    pipe.refuse_short = client.durability.refuses(args)
    pipe.execute_command(*args, **options)
    reply = pipe.execute(raise_on_error=False)[0]
    if isinstance(reply, NoScriptError):
        raise reply  # redis-py's `Script` loads it and runs it again
    if isinstance(reply, Exception):
        raise unavailable(reply) from reply
    return reply


# The store's clients unless told otherwise: no WAIT.
NO_WAIT = Durability()
