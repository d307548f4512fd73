"""The forms of SWITCHBOARD_REDIS_URL, read in one place (`parse_redis_url`).

- ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS) and
  ``unix:///path/to/redis.sock[?db=N]``: one Redis server, handed to redis-py as they are.
- ``redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/<master>[/db]``: the
  primary of the group ``<master>`` as Redis Sentinel names it, asked of the sentinels
  listed (port 26379 unless given) on every new connection, so a client follows a
  failover without a restart. The user and password are the primary's (and its
  replicas'); the sentinels themselves are reached without them.
- ``redis+cluster://…``: not supported yet (a clear error at start, not a traceback).

The Celery broker defaults to the same URL; a sentinel URL becomes kombu's own form
(`SentinelUrl.kombu_url` with ``master_name`` in the transport options).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from switchboard.shared.config import ConfigError

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
PLAIN_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_SENTINEL_PORT = 26379

SENTINEL_FORM = f"{SENTINEL_SCHEME}://[:password@]host:port[,host:port...]/<master>[/db]"
EXPECTED_FORMS = (
    f"redis://host:port[/db], rediss://host:port[/db], unix:///path.sock or {SENTINEL_FORM}"
)


@dataclass(frozen=True)
class SentinelUrl:
    """A ``redis+sentinel://`` URL, read: where the sentinels are and what to ask them for."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    def connection_kwargs(self) -> dict[str, object]:
        """What every connection to the primary is opened with (database, credentials)."""
        kwargs: dict[str, object] = {"db": self.db}
        if self.username:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        return kwargs

    def kombu_url(self) -> str:
        """kombu's form of the same sentinels: ``sentinel://h1:p1/db;sentinel://h2:p2/db``
        (the master's name goes in the transport options as ``master_name``)."""
        auth = ""
        if self.password is not None or self.username:
            user = quote(self.username or "", safe="")
            auth = f"{user}:{quote(self.password or '', safe='')}@"
        return ";".join(
            f"sentinel://{auth}{_host_text(host)}:{port}/{self.db}" for host, port in self.sentinels
        )


def parse_redis_url(url: str, setting: str = "SWITCHBOARD_REDIS_URL") -> SentinelUrl | None:
    """The sentinel URL read from ``url``; None for a one-server form redis-py reads itself.

    Raises `ConfigError` (naming ``setting`` and the form expected, never the password)
    for anything else: an unknown scheme, ``redis+cluster://`` (not supported yet), or a
    sentinel URL without sentinels, without a master name, or with a bad port or db."""
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ConfigError(f"{setting}: not a URL: expected {EXPECTED_FORMS}", key_path=setting)
    if scheme in PLAIN_SCHEMES:
        return None
    if scheme == CLUSTER_SCHEME:
        raise ConfigError(
            f"{CLUSTER_SCHEME}:// is not supported yet: set {setting} to one of {EXPECTED_FORMS}",
            key_path=setting,
        )
    if scheme != SENTINEL_SCHEME:
        raise ConfigError(
            f"{setting}: unsupported scheme {scheme}://: expected {EXPECTED_FORMS}",
            key_path=setting,
        )
    return _parse_sentinel(url, setting)


def _parse_sentinel(url: str, setting: str) -> SentinelUrl:
    def bad(problem: str) -> ConfigError:
        return ConfigError(f"{setting}: {problem}: expected {SENTINEL_FORM}", key_path=setting)

    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unbalanced [ ] around an IPv6 address
        raise bad(f"unclosed [ in a sentinel address ({exc})") from None
    if parts.query or parts.fragment:
        raise bad("a sentinel URL takes no ?query or #fragment")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
        if not colon:  # `redis+sentinel://secret@host` means a password, as redis:// does
            username, password = None, unquote(user)
    sentinels = tuple(_sentinel_address(item, bad) for item in hosts.split(","))
    segments = parts.path.removeprefix("/").removesuffix("/").split("/")
    if not segments or not segments[0]:
        raise bad("no master name after the sentinels")
    if len(segments) > 2:
        raise bad(f"too many path segments ({len(segments)})")
    master = unquote(segments[0])
    db = 0
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise bad(f"the database must be a number, not {segments[1]!r}")
        db = int(segments[1])
    return SentinelUrl(sentinels, master, db, username, password)


def _sentinel_address(item: str, make: Callable[[str], ConfigError]) -> tuple[str, int]:
    """``host[:port]`` or ``[v6addr][:port]`` of one sentinel."""
    item = item.strip()
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket:
            raise make(f"unclosed [ in sentinel address {item!r}")
        port_text = rest[1:] if rest.startswith(":") else rest
        if rest and not rest.startswith(":"):
            raise make(f"bad sentinel address {item!r}")
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise make("a sentinel address has no host (list them as host:port,host:port)")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise make(f"bad port {port_text!r} for sentinel {host}")
    return host, int(port_text)


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host
