"""Fast path: the store's Redis client that runs each thread's commands on a connection of
its own, sent straight to it (only with ``Settings.fast_paths``; see `ThreadHeldRedis`).

The plain path is redis-py's own client on a blocking pool (`store.client.connect`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import redis
from redis.client import EMPTY_RESPONSE, NEVER_DECODE

# Command options only redis-py's full client path handles (see `ThreadHeldRedis`).
_FULL_PATH_OPTIONS = frozenset({NEVER_DECODE, EMPTY_RESPONSE})


class _Held:
    """A thread's connection, handed back to its pool once, when the thread's locals go
    (the thread ended) or the client closes."""

    __slots__ = ("conn", "pid", "pool")

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self.pool: redis.ConnectionPool | None = pool
        self.pid = os.getpid()
        self.conn = pool.get_connection()

    def release(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None and self.pid == os.getpid():
            pool.release(self.conn)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the pool may be gone
            self.release()


class ThreadHeldRedis(redis.Redis):
    """A client whose commands run on a connection each thread keeps to itself.

    redis-py takes a connection from the pool and puts it back around every command; the
    checkout (a lock, a readiness poll of the socket, pool bookkeeping) cost about as much
    client CPU as the rest of a command: 98 µs per HGETALL through the pool against 55 µs
    on a held connection, measured here on redis-py 8.1. A store call is mostly a single
    command, so every round trip paid it. Here a thread takes one connection on its first
    command and keeps it until the thread ends (a forked child takes its own); pipelines
    and pub/sub still take theirs from the pool. Like the pool, each command first checks
    that the held connection is still open and clean; a command that fails closes it and
    the next one reconnects it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._held = threading.local()
        super().__init__(*args, **kwargs)

    @property
    def connection(self) -> Any:
        """This thread's connection (taken from the pool on first use)."""
        held: _Held | None = getattr(self._held, "value", None)
        if held is None or held.pool is None or held.pid != os.getpid():
            held = self._held.value = _Held(self.connection_pool)
        return held.conn

    @connection.setter
    def connection(self, value: Any) -> None:
        """redis-py sets None here (no single shared connection); threads keep theirs."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """Run a command on this thread's connection, checked first as the pool checks a
        connection it hands out: one the server closed (a restart, a kill) or that holds
        unread data is reconnected, so the command never fails for a stale socket.

        The command goes straight to the connection (redis-py's packer, socket and parser,
        and the client's response callbacks): redis-py 8's client path around it (retry
        closures, timing for its metrics, option checks) cost about as much client CPU as
        the round trip's own work. A command that fails on the connection, or that asks for
        what only that path does (undecoded replies, a default for an empty reply), is
        passed to it (a failed one only if the client retries: the store's does not, a
        task retries the step instead)."""
        conn = self.connection
        try:
            if conn.can_read():
                raise redis.ConnectionError("connection has unread data")
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            conn.disconnect()
            # Reconnected here, not by sending the command: redis-py's send reconnects to
            # the address last used, where `connect` of a sentinel-managed connection asks
            # the sentinels for the primary first (after a failover they differ).
            conn.connect()
        options.pop("keys", None)  # only for client-side caching, which is off here
        if options.keys() & _FULL_PATH_OPTIONS:
            return self._execute_command(*args, **options)  # type: ignore[no-untyped-call]
        try:
            conn.send_command(*args)
            response = conn.read_response()
        except (redis.ConnectionError, redis.TimeoutError):
            # redis-py closed the connection; the next command reconnects it. A client
            # configured to retry retries on redis-py's path, as it would have.
            if not conn.retry.get_retries():
                raise
            return self._execute_command(*args, **options)  # type: ignore[no-untyped-call]
        callback = self.response_callbacks.get(args[0])  # type: ignore[no-untyped-call]
        return callback(response, **options) if callback is not None else response

    def close(self) -> None:
        """Hand this thread's connection back; close the pool if the client owns it."""
        held: _Held | None = getattr(self._held, "value", None)
        if held is not None:
            self._held.value = None
            held.release()
        if self.auto_close_connection_pool:
            self.connection_pool.close()
