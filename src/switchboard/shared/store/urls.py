"""The forms of SWITCHBOARD_REDIS_URL, read in one place (`parse_redis_url`).

- ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS) and
  ``unix:///path/to/redis.sock[?db=N]``: one Redis server, handed to redis-py as they are.
- ``redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/<master>[/db]``: the
  primary of the group ``<master>`` as Redis Sentinel names it, asked of the sentinels
  listed (port 26379 unless given) on every new connection, so a client follows a
  failover without a restart. The user and password are the primary's (and its
  replicas'); the sentinels themselves are reached without them.
- ``redis+cluster://[[user]:password@]host[:port][,host[:port]…]``: a Redis Cluster,
  found through the nodes listed (seeds: any of its nodes, port 6379 unless given). The
  store's keys share one hash slot (`ClusterUrl`, ``store/cluster.py``); a cluster has
  database 0 only, so the URL takes no ``/db``.

The Celery broker defaults to the same URL; a sentinel URL becomes kombu's own form
(`SentinelUrl.kombu_url` with ``master_name`` in the transport options). kombu has no
cluster transport: with a cluster URL the broker must be set on its own
(SWITCHBOARD_BROKER_URL: a plain Redis, a sentinel group or RabbitMQ).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, quote, unquote, urlsplit

from switchboard.shared.config import REDIS_CLUSTER_SCHEME, ConfigError

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = REDIS_CLUSTER_SCHEME
PLAIN_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_CLUSTER_PORT = 6379

SENTINEL_FORM = f"{SENTINEL_SCHEME}://[:password@]host:port[,host:port...]/<master>[/db]"
CLUSTER_FORM = f"{CLUSTER_SCHEME}://[:password@]host:port[,host:port...]"
EXPECTED_FORMS = (
    "redis://host:port[/db], rediss://host:port[/db], unix:///path.sock, "
    f"{SENTINEL_FORM} or {CLUSTER_FORM}"
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


@dataclass(frozen=True)
class ClusterUrl:
    """A ``redis+cluster://`` URL, read: the seed nodes the cluster is found through."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None

    def connection_kwargs(self) -> dict[str, Any]:
        """What every connection to a node is opened with (credentials)."""
        kwargs: dict[str, Any] = {}
        if self.username:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        return kwargs


def parse_redis_url(
    url: str, setting: str = "SWITCHBOARD_REDIS_URL"
) -> SentinelUrl | ClusterUrl | None:
    """The sentinel or cluster URL read from ``url``; None for a one-server form redis-py
    reads itself.

    Raises `ConfigError` (naming ``setting`` and the form expected, never the password)
    for anything else: an unknown scheme, or a sentinel or cluster URL without its hosts,
    a sentinel URL without a master name, a bad port or db."""
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ConfigError(f"{setting}: not a URL: expected {EXPECTED_FORMS}", key_path=setting)
    if scheme in PLAIN_SCHEMES:
        return None
    if scheme == CLUSTER_SCHEME:
        return _parse_cluster(url, setting)
    if scheme != SENTINEL_SCHEME:
        raise ConfigError(
            f"{setting}: unsupported scheme {scheme}://: expected {EXPECTED_FORMS}",
            key_path=setting,
        )
    return _parse_sentinel(url, setting)


def _parse_cluster(url: str, setting: str) -> ClusterUrl:
    def bad(problem: str) -> ConfigError:
        return ConfigError(f"{setting}: {problem}: expected {CLUSTER_FORM}", key_path=setting)

    parts, username, password, hosts = _split(url, bad, "node", "cluster")
    if parts.path.strip("/"):
        raise bad("a cluster has database 0 only: the URL takes no /db")
    nodes = tuple(_address(item, bad, "node", DEFAULT_CLUSTER_PORT) for item in hosts.split(","))
    return ClusterUrl(nodes, username, password)


def _split(
    url: str, bad: Callable[[str], ConfigError], what: str, form: str
) -> tuple[SplitResult, str | None, str | None, str]:
    """The URL's parts, its user and password, and its comma-separated host list."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unbalanced [ ] around an IPv6 address
        raise bad(f"unclosed [ in a {what} address ({exc})") from None
    if parts.query or parts.fragment:
        raise bad(f"a {form} URL takes no ?query or #fragment")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
        if not colon:  # `redis+sentinel://secret@host` means a password, as redis:// does
            username, password = None, unquote(user)
    return parts, username, password, hosts


def _parse_sentinel(url: str, setting: str) -> SentinelUrl:
    def bad(problem: str) -> ConfigError:
        return ConfigError(f"{setting}: {problem}: expected {SENTINEL_FORM}", key_path=setting)

    parts, username, password, hosts = _split(url, bad, "sentinel", "sentinel")
    sentinels = tuple(
        _address(item, bad, "sentinel", DEFAULT_SENTINEL_PORT) for item in hosts.split(",")
    )
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


def _address(
    item: str, make: Callable[[str], ConfigError], what: str, default_port: int
) -> tuple[str, int]:
    """``host[:port]`` or ``[v6addr][:port]`` of one sentinel or cluster node."""
    item = item.strip()
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket:
            raise make(f"unclosed [ in {what} address {item!r}")
        port_text = rest[1:] if rest.startswith(":") else rest
        if rest and not rest.startswith(":"):
            raise make(f"bad {what} address {item!r}")
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise make(f"a {what} address has no host (list them as host:port,host:port)")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise make(f"bad port {port_text!r} for {what} {host}")
    return host, int(port_text)


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host
