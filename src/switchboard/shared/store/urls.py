"""The forms of SWITCHBOARD_REDIS_URL, read in one place (`parse_redis_url`).

- ``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS) and
  ``unix:///path/to/redis.sock[?db=N]``: one Redis server, handed to redis-py as they are.
- ``redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/<master>[/db]``: the
  primary of the group ``<master>`` as Redis Sentinel names it, asked of the sentinels
  listed (port 26379 unless given) on every new connection, so a client follows a
  failover without a restart. The user and password are the primary's (and its
  replicas'); sentinels that require a password of their own (``requirepass`` in their
  configuration) are given it as ``?sentinel_password=…`` (and ``sentinel_username=…``).
- ``rediss+sentinel://…[?ssl_ca_certs=PATH&…]``: the same over TLS, to the sentinels and
  to the primary, with the TLS options of ``rediss+cluster://`` below.
- ``redis+cluster://[[user]:password@]host[:port][,host[:port]…]``: a Redis Cluster,
  found through the nodes listed (seeds: any of its nodes, port 6379 unless given). The
  store's clients (redis-py's `RedisCluster`, ``store/cluster.py``) send each command to
  the primary that owns its key's slot; a cluster has database 0 only, so the URL takes
  no ``/db``.
- ``rediss+cluster://…[?ssl_ca_certs=PATH&…]``: the same over TLS (as managed clusters
  offer it), with redis-py's ``ssl_*`` connection options as query parameters
  (`TLS_OPTIONS`): the CA to trust, a client certificate and key, ``ssl_cert_reqs``
  and ``ssl_check_hostname``.

The Celery broker defaults to the same URL; a sentinel URL becomes kombu's own form
(`SentinelUrl.kombu_url` with ``master_name`` in the transport options). kombu has no
cluster transport: with a cluster URL the broker must be set on its own
(SWITCHBOARD_BROKER_URL: a plain Redis, a sentinel group or RabbitMQ).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import (
    SplitResult,
    parse_qsl,
    quote,
    unquote,
    urlencode,
    urlsplit,
)

from switchboard.shared.config import REDIS_CLUSTER_SCHEME, REDIS_TLS_CLUSTER_SCHEME, ConfigError

SENTINEL_SCHEME = "redis+sentinel"
TLS_SENTINEL_SCHEME = "rediss+sentinel"
CLUSTER_SCHEME = REDIS_CLUSTER_SCHEME
TLS_CLUSTER_SCHEME = REDIS_TLS_CLUSTER_SCHEME
# The TLS options a ``rediss+cluster://`` or ``rediss+sentinel://`` URL takes as query
# parameters (redis-py's names).
TLS_OPTIONS = (
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
)
# The options a sentinel URL takes as query parameters: the sentinels' own credentials.
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
_CERT_REQS = ("none", "optional", "required")
PLAIN_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_CLUSTER_PORT = 6379

SENTINEL_FORM = (
    f"{SENTINEL_SCHEME}://[:password@]host:port[,host:port...]/<master>[/db]"
    "[?sentinel_password=…] "
    f"(over TLS: {TLS_SENTINEL_SCHEME}://…[?ssl_ca_certs=PATH&…])"
)
CLUSTER_FORM = (
    f"{CLUSTER_SCHEME}://[:password@]host:port[,host:port...] "
    f"(over TLS: {TLS_CLUSTER_SCHEME}://…[?ssl_ca_certs=PATH&…])"
)
EXPECTED_FORMS = (
    "redis://host:port[/db], rediss://host:port[/db], unix:///path.sock, "
    f"{SENTINEL_FORM} or {CLUSTER_FORM}"
)


# TCP socket options a unix-socket connection does not take: redis-py's
# UnixDomainSocketConnection refuses them (TypeError), so they are dropped for `unix://`.
TCP_ONLY_OPTIONS = ("socket_keepalive", "socket_keepalive_options")


def plain_url_options(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """The connection ``options`` a plain URL's connections can take: for ``unix://``,
    without the TCP-only ones (keepalive); for ``redis://`` and ``rediss://``, all."""
    if not url.lower().startswith("unix://"):
        return options
    return {k: v for k, v in options.items() if k not in TCP_ONLY_OPTIONS}


def unix_kombu_url(url: str) -> str:
    """kombu's form of a ``unix:///path.sock[?db=N]`` URL, for the broker:
    ``redis+socket:///path.sock[?virtual_host=N]`` (kombu reads no ``unix://`` and takes
    the database as its virtual host); credentials and other parameters kept."""
    parts = urlsplit(url)
    query = [
        ("virtual_host" if key == "db" else key, value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return f"redis+socket://{parts.netloc}{parts.path}" + (f"?{urlencode(query)}" if query else "")


@dataclass(frozen=True)
class SentinelUrl:
    """A ``redis+sentinel://`` (or, over TLS, ``rediss+sentinel://``) URL, read: where the
    sentinels are, what to ask them for, and how to connect."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    # redis-py's `ssl_*` connection options, from the URL's query (`TLS_OPTIONS`).
    tls_options: tuple[tuple[str, Any], ...] = ()
    # The sentinels' own username and password (`SENTINEL_OPTIONS`), if they require one.
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    def _tls_kwargs(self) -> dict[str, Any]:
        return {"ssl": True, **dict(self.tls_options)} if self.tls else {}

    def connection_kwargs(self) -> dict[str, Any]:
        """What every connection to the primary is opened with: database, credentials, and
        over TLS ``ssl`` (redis-py's sentinel pools then open TLS connections) with the
        TLS options."""
        kwargs: dict[str, Any] = {"db": self.db, **self._tls_kwargs()}
        if self.username:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        return kwargs

    def sentinel_kwargs(self) -> dict[str, Any]:
        """What a connection to a sentinel adds to its own options: the sentinels' own
        credentials, if any, and over TLS ``ssl`` and the TLS options (the sentinels take
        the primary's certificate authority)."""
        kwargs = self._tls_kwargs()
        if self.sentinel_username:
            kwargs["username"] = self.sentinel_username
        if self.sentinel_password is not None:
            kwargs["password"] = self.sentinel_password
        return kwargs

    def kombu_ssl(self) -> dict[str, Any] | None:
        """Celery's ``broker_use_ssl`` for the same primary over TLS (kombu opens its
        sentinel-managed connections with TLS when it is set), else None."""
        if not self.tls:
            return None
        return dict(self.tls_options) or {"ssl_cert_reqs": "required"}

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
    """A ``redis+cluster://`` (or, over TLS, ``rediss+cluster://``) URL, read: the seed
    nodes the cluster is found through, and how to connect to a node."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    tls: bool = False
    # redis-py's `ssl_*` connection options, from the URL's query (`TLS_OPTIONS`).
    tls_options: tuple[tuple[str, Any], ...] = ()

    def connection_kwargs(self) -> dict[str, Any]:
        """What every connection to a node is opened with: credentials, and the TLS
        options for a TLS connection class."""
        kwargs: dict[str, Any] = dict(self.tls_options)
        if self.username:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        return kwargs

    def client_kwargs(self) -> dict[str, Any]:
        """`connection_kwargs` for a redis-py client (`Redis`, `RedisCluster`): with
        ``ssl`` set when the cluster is reached over TLS."""
        return {**self.connection_kwargs(), "ssl": True} if self.tls else self.connection_kwargs()


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
    if scheme in (CLUSTER_SCHEME, TLS_CLUSTER_SCHEME):
        return _parse_cluster(url, setting)
    if scheme not in (SENTINEL_SCHEME, TLS_SENTINEL_SCHEME):
        raise ConfigError(
            f"{setting}: unsupported scheme {scheme}://: expected {EXPECTED_FORMS}",
            key_path=setting,
        )
    return _parse_sentinel(url, setting)


def _parse_cluster(url: str, setting: str) -> ClusterUrl:
    def bad(problem: str) -> ConfigError:
        return ConfigError(f"{setting}: {problem}: expected {CLUSTER_FORM}", key_path=setting)

    tls = url.lower().startswith(f"{TLS_CLUSTER_SCHEME}://")
    parts, username, password, hosts = _split(url, bad, "node", "cluster", query=tls)
    if parts.path.strip("/"):
        raise bad("a cluster has database 0 only: the URL takes no /db")
    nodes = tuple(_address(item, bad, "node", DEFAULT_CLUSTER_PORT) for item in hosts.split(","))
    options = _query_options(parts.query, bad) if tls else ()
    return ClusterUrl(nodes, username, password, tls=tls, tls_options=options)


def _query_options(
    query: str, bad: Callable[[str], ConfigError], *, tls: bool = True, extra: tuple[str, ...] = ()
) -> tuple[tuple[str, Any], ...]:
    """The ``ssl_*`` options (``tls``) and the ``extra`` ones of a URL's query, checked;
    the extra ones are answered as they are."""
    accepted = (*extra, *(TLS_OPTIONS if tls else ()))
    options: list[tuple[str, Any]] = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in accepted:
            raise bad(f"unknown option {key!r} (this URL takes {', '.join(accepted)})")
        if key in extra:
            options.append((key, value))
            continue
        if key == "ssl_cert_reqs" and value.lower() not in _CERT_REQS:
            raise bad(f"ssl_cert_reqs is one of {', '.join(_CERT_REQS)}, not {value!r}")
        if key == "ssl_check_hostname":
            if value.lower() not in ("true", "false"):
                raise bad(f"ssl_check_hostname is true or false, not {value!r}")
            options.append((key, value.lower() == "true"))
            continue
        options.append((key, value.lower() if key == "ssl_cert_reqs" else value))
    return tuple(options)


def _split(
    url: str, bad: Callable[[str], ConfigError], what: str, form: str, *, query: bool = False
) -> tuple[SplitResult, str | None, str | None, str]:
    """The URL's parts, its user and password, and its comma-separated host list (a
    ?query only where ``query`` allows one)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unbalanced [ ] around an IPv6 address
        raise bad(f"unclosed [ in a {what} address ({exc})") from None
    if parts.fragment or (parts.query and not query):
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

    tls = url.lower().startswith(f"{TLS_SENTINEL_SCHEME}://")
    parts, username, password, hosts = _split(url, bad, "sentinel", "sentinel", query=True)
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
    options = _query_options(parts.query, bad, tls=tls, extra=SENTINEL_OPTIONS)
    auth = {key: value for key, value in options if key in SENTINEL_OPTIONS}
    return SentinelUrl(
        sentinels,
        master,
        db,
        username,
        password,
        tls=tls,
        tls_options=tuple((k, v) for k, v in options if k not in SENTINEL_OPTIONS),
        sentinel_username=auth.get("sentinel_username") or None,
        sentinel_password=auth.get("sentinel_password"),
    )


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
