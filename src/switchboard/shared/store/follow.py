"""The thread that follows where a pool's primary is (a Sentinel group's, a cluster's).

`sentinel.follow_primary` starts one per sentinel pool, `cluster.follow_cluster` one per
cluster client (for all its nodes). It checks every half second until the store client
that owns it is closed (`Follower.stop`), or else until what it follows is gone (a pool
made elsewhere, kombu's, has no such client).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("switchboard.store")

# How long closing a sync store client waits for its follower thread to end (a check under
# way can take a connect timeout).
FOLLOWER_JOIN_S = 2.5


class Follower:
    """A daemon thread calling ``check(pool)`` every ``every_s`` while the pool lives and
    `stop` has not been called; ``on_end()`` runs once when it ends."""

    def __init__(
        self,
        pool: Any,
        check: Callable[[Any], None],
        *,
        every_s: float,
        name: str,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._follow,
            args=(weakref.ref(pool), check, every_s, on_end),
            name=name,
            daemon=True,
        )
        self._thread.start()

    def stop(self, *, join_s: float = 0.0) -> None:
        """End the thread at its next wake (now, if it is waiting); wait for it up to
        ``join_s`` (a check under way can take a connect timeout)."""
        self._stopped.set()
        if join_s > 0 and self._thread is not threading.current_thread():
            self._thread.join(join_s)

    @property
    def running(self) -> bool:
        """Whether the thread is still alive."""
        return self._thread.is_alive()

    def _follow(
        self,
        ref: weakref.ref[Any],
        check: Callable[[Any], None],
        every_s: float,
        on_end: Callable[[], None] | None,
    ) -> None:
        try:
            while not self._stopped.wait(every_s):
                pool = ref()
                if pool is None:
                    return
                try:
                    check(pool)
                except Exception:  # a check that failed must not end the following
                    log.exception("checking where the primary of a Redis pool is failed")
                del pool  # held only while checking: the pool can be collected meanwhile
        finally:
            if on_end is not None:
                on_end()


def cut_connections(pool: Any) -> None:
    """Shut down the socket of every connection the pool made (idle or in use)."""
    for _ in range(3):  # an async pool's lists change under us: copy them again
        try:
            made = getattr(pool, "_connections", None)  # a blocking pool lists all here
            if made is None:
                made = [*pool._available_connections, *pool._in_use_connections]
            made = list(made)
            break
        except RuntimeError:
            continue
    else:
        return  # the next check cuts them
    for conn in made:
        sock = getattr(conn, "_sock", None)  # a sync connection's socket
        writer = getattr(conn, "_writer", None)  # an async one's stream
        if writer is not None:
            sock = writer.get_extra_info("socket")
        if sock is not None:
            _shut_down(sock)


def _shut_down(sock: Any) -> None:
    """Shut the socket down for both directions, through a duplicate of its descriptor:
    an event loop's transport socket (uvloop's) refuses ``shutdown()`` itself, and a
    shutdown acts on the socket, whichever descriptor names it."""
    with contextlib.suppress(OSError, ValueError):
        fd = sock.fileno()
        if fd < 0:
            return  # closed meanwhile
        with socket.socket(fileno=os.dup(fd)) as dup:
            dup.shutdown(socket.SHUT_RDWR)
