"""The thread that follows where a pool's primary is (a Sentinel group's, a cluster's).

`client.follow_primary` starts one per sentinel pool, `cluster.follow_cluster` one per
cluster client (for all its nodes). It checks every half second until the store client
that owns it is closed (`Follower.stop`), or else until what it follows is gone (a pool
made elsewhere, kombu's, has no such client).
"""

from __future__ import annotations

import logging
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
