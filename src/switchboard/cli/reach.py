"""Whether a configured Redis or broker answers, checked before `up` starts anything.

`up` with `SWITCHBOARD_REDIS_URL` or `SWITCHBOARD_BROKER_URL` pointing at nothing would
otherwise print its banner and then answer 503 to every request while the worker retries
its connection a hundred times. Each URL is tried for a while (a server that is still
starting gets that long), then refused in one line naming the URL, what was tried and for
how long.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit, urlunsplit

from switchboard.cli.common import EXIT_UNAVAILABLE, _fail

# How long `up` waits for a configured Redis or broker to answer before it gives up.
REACH_WAIT_S = 10.0
_RETRY_S = 0.5


def shown_url(url: str) -> str:
    """``url`` with its password masked, for messages."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def require_redis(url: str, setting: str, wait_s: float = REACH_WAIT_S) -> None:
    """Return once the Redis at ``url`` answers a PING; exit 3 in one line after ``wait_s``."""
    from switchboard.shared.errors import StoreUnavailable
    from switchboard.shared.store.client import connect_plain

    deadline = time.monotonic() + wait_s
    while True:
        client = connect_plain(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            client.ping()
            return
        except StoreUnavailable as exc:
            cause = str(exc.__cause__ or exc)
        finally:
            client.close()
        if time.monotonic() >= deadline:
            _unreachable("Redis", url, setting, cause, wait_s)
        time.sleep(_RETRY_S)


def require_broker(url: str, setting: str, wait_s: float = REACH_WAIT_S) -> None:
    """Return once the AMQP broker at ``url`` accepts a connection; exit 3 after ``wait_s``."""
    from kombu.connection import Connection

    # kombu ships no type hints for Connection.
    with Connection(url, connect_timeout=2) as conn:  # type: ignore[no-untyped-call]
        try:
            conn.ensure_connection(max_retries=None, interval_start=_RETRY_S, timeout=wait_s)
        except Exception as exc:
            _unreachable("the broker", url, setting, str(exc) or type(exc).__name__, wait_s)


def _unreachable(what: str, url: str, setting: str, cause: str, wait_s: float) -> None:
    _fail(
        "unreachable",
        f"cannot reach {what} at {shown_url(url)} ({setting}): {cause.rstrip('.')}; "
        f"tried for {wait_s:g} s",
        EXIT_UNAVAILABLE,
    )
