"""A private Redis Sentinel group for the tests and the benchmark: a primary, its replicas
and three sentinels, real redis-server processes on free loopback ports, stopped on
`stop()`, on leaving the `with` block, or when the interpreter exits.

The primary is a plain `RedisServer`, every replica a `RedisReplica` following it, every
sentinel a `RedisSentinel` (``redis-server <conf> --sentinel``) monitoring it under one
master name. `url` is the product's ``redis+sentinel://`` URL of the group; `named_primary`
asks the sentinels, so it stays right after a failover. With ``tls`` every node speaks TLS
only (the sentinels too, and replication), and `url` is the ``rediss+sentinel://`` one
naming the CA; with ``sentinel_password`` the sentinels require it (``requirepass``, and
give it to each other), and `url` carries it as ``?sentinel_password=…``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

import redis

from switchboard.shared.errors import Unavailable
from switchboard.supervisor.redis_server import RedisServer, TlsFiles, find_redis_server

HOST = "127.0.0.1"
MASTER_NAME = "sbtest"
SENTINELS = 3
# Sentinel's own settings: a primary silent this long is down; a failover gives up after.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000
READY_TIMEOUT_S = 30.0
_POLL_INTERVAL_S = 0.2
_KILL_WAIT_S = 10.0
_LOG_TAIL_CHARS = 1500


def redis_sentinel_missing() -> str | None:
    """Why this machine cannot run a Sentinel group (no redis-server, or one without a
    sentinel mode), else None."""
    try:
        server = find_redis_server()
    except Unavailable as exc:
        return f"no redis-server to run a Sentinel group: {exc}"
    told = subprocess.run([server, "--help"], capture_output=True, text=True, timeout=30)
    if "--sentinel" not in told.stdout + told.stderr:
        return f"{server} has no sentinel mode (`--help` names no --sentinel)"
    return None


class RedisReplica(RedisServer):
    """A redis-server that replicates ``primary_port`` from its start (``--replicaof``)."""

    def __init__(
        self,
        data_dir: Path,
        primary_port: int,
        port: int | None = None,
        *,
        tls: TlsFiles | None = None,
    ) -> None:
        super().__init__(data_dir, port, tls=tls)
        self.primary_port = primary_port

    def _argv(self) -> list[str]:
        tls = ("--tls-replication", "yes") if self.tls else ()
        return [*super()._argv(), "--replicaof", HOST, str(self.primary_port), *tls]

    def __repr__(self) -> str:
        return f"RedisReplica({HOST}:{self.port} of {self.primary_port}, pid={self.pid})"


class RedisSentinel(RedisServer):
    """``redis-server sentinel.conf --sentinel`` monitoring ``primary_port`` as
    ``master_name``; Sentinel rewrites its conf file, so each start writes it afresh."""

    def __init__(
        self,
        data_dir: Path,
        primary_port: int,
        *,
        master_name: str = MASTER_NAME,
        quorum: int = 2,
        down_after_ms: int = DOWN_AFTER_MS,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
        tls: TlsFiles | None = None,
        password: str | None = None,
    ) -> None:
        super().__init__(data_dir, tls=tls)
        self.password = password
        self.conf = self.data_dir / "sentinel.conf"
        self.primary_port = primary_port
        self.master_name = master_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    def _argv(self) -> list[str]:
        assert self.executable is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        name = self.master_name
        conf = (
            f"sentinel monitor {name} {HOST} {self.primary_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}\n"
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
        )
        if self.password is not None:  # asked of clients, and given to the other sentinels
            conf += f"requirepass {self.password}\nsentinel sentinel-pass {self.password}\n"
        self.conf.write_text(conf)
        # With TLS, the primary and the replicas are reached over TLS too.
        tls = ("--tls-replication", "yes") if self.tls else ()
        return [
            self.executable,
            str(self.conf),
            "--sentinel",
            *self._port_args(),
            *tls,
            *("--bind", HOST, "--dir", str(self.data_dir)),
            *("--logfile", str(self.log_path), "--daemonize", "no"),
        ]

    def _client_kwargs(self) -> dict[str, object]:
        """A client of this sentinel gives its password, if it requires one."""
        kwargs = super()._client_kwargs()
        return {**kwargs, "password": self.password} if self.password is not None else kwargs

    def __repr__(self) -> str:
        return f"RedisSentinel({HOST}:{self.port}, pid={self.pid})"


class RedisSentinelGroup:
    """A primary, ``replicas`` replicas of it and ``sentinels`` sentinels watching them
    (quorum: a majority of the sentinels), under ``base_dir``."""

    def __init__(
        self,
        base_dir: Path,
        *,
        replicas: int = 1,
        sentinels: int = SENTINELS,
        master_name: str = MASTER_NAME,
        down_after_ms: int = DOWN_AFTER_MS,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
        ready_timeout_s: float = READY_TIMEOUT_S,
        tls: TlsFiles | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        if replicas < 0 or sentinels < 1:
            raise ValueError(
                "a Sentinel group needs at least one sentinel and no negative replicas"
            )
        self.base_dir = Path(base_dir).absolute()
        self.replica_count = replicas
        self.sentinel_count = sentinels
        self.master_name = master_name
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.ready_timeout_s = ready_timeout_s
        self.tls = tls  # every node (sentinels included) and replication on TLS only
        self.sentinel_password = sentinel_password  # the sentinels' requirepass
        self._primary: RedisServer | None = None
        self.replicas: list[RedisReplica] = []
        self.sentinels: list[RedisSentinel] = []

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the primary, the replicas and the sentinels, and wait until every sentinel
        sees every replica and the other sentinels and every replica is synced; raise
        `Unavailable` (stopping what started) if it does not come to that."""
        if self._primary is not None:
            raise RuntimeError("the Sentinel group is already started")
        try:
            self._primary = RedisServer(self.base_dir / "primary", tls=self.tls)
            self._primary.start()
            port = self._primary.port
            for n in range(self.replica_count):
                replica = RedisReplica(self.base_dir / f"replica{n}", port, tls=self.tls)
                self.replicas.append(replica)
                replica.start()
            for n in range(self.sentinel_count):
                sentinel = RedisSentinel(
                    self.base_dir / f"sentinel{n}",
                    port,
                    master_name=self.master_name,
                    quorum=self.sentinel_count // 2 + 1,
                    down_after_ms=self.down_after_ms,
                    failover_timeout_ms=self.failover_timeout_ms,
                    tls=self.tls,
                    password=self.sentinel_password,
                )
                self.sentinels.append(sentinel)
                sentinel.start()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every node, the sentinels first (so none starts a failover meanwhile): the
        group keeps no data worth a clean shutdown, so each is killed; safe to call twice."""
        for node in reversed(self.nodes):
            self.kill(node)
        self._primary = None
        self.replicas = []
        self.sentinels = []

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- access ----------------------------------------------------------------------------

    @property
    def primary(self) -> RedisServer:
        """The node started as the primary (after a failover it may be down or a replica;
        `named_primary` says which node the sentinels name now)."""
        if self._primary is None:
            raise RuntimeError("the Sentinel group is not started")
        return self._primary

    @property
    def nodes(self) -> list[RedisServer]:
        """Every node in start order: the primary, the replicas, the sentinels."""
        first = [self._primary] if self._primary is not None else []
        return [*first, *self.replicas, *self.sentinels]

    @property
    def url(self) -> str:
        """The product's URL of database 0 of the group, through its sentinels."""
        return self.url_for_db(0)

    def url_for_db(self, db: int) -> str:
        """The product's URL of database ``db`` of the group, through its sentinels (over
        TLS: ``rediss+sentinel://…?ssl_ca_certs=<the CA>``)."""
        if not self.sentinels:
            raise RuntimeError("the Sentinel group is not started")
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        query = []
        if self.sentinel_password is not None:
            query.append(f"sentinel_password={quote(self.sentinel_password, safe='')}")
        if self.tls is not None:
            query.append(f"ssl_ca_certs={quote(str(self.tls.ca_file))}")
        scheme = "redis+sentinel" if self.tls is None else "rediss+sentinel"
        url = f"{scheme}://{hosts}/{self.master_name}/{db}"
        return f"{url}?{'&'.join(query)}" if query else url

    def named_primary(self) -> set[int]:
        """The primary's port as every running sentinel names it right now."""
        ports = set()
        for sentinel in self.sentinels:
            if sentinel.pid is None:
                continue
            with sentinel.client() as client:
                _, port = client.sentinel_get_master_addr_by_name(self.master_name)
                ports.add(int(port))
        return ports

    def ready(self) -> bool:
        """Every sentinel sees every replica and the other sentinels; every replica synced."""
        try:
            return self._not_ready_reason() is None
        except (redis.RedisError, OSError):
            return False

    def kill(self, node: RedisServer) -> None:
        """SIGKILL ``node``'s process group and wait for it to exit (then close its log)."""
        pid = node.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + _KILL_WAIT_S
            while node.pid is not None and time.monotonic() < deadline:
                time.sleep(0.01)
        node.stop()  # closes its log; the process is gone already

    def logs(self) -> str:
        """Every node's log tail (for failure messages)."""
        return "\n".join(
            f"--- {HOST}:{node.port} {node.log_path}\n{_tail(node.log_path)}" for node in self.nodes
        )

    # -- readiness -------------------------------------------------------------------------

    def _not_ready_reason(self) -> str | None:
        for node in self.nodes:
            if node.pid is None:
                return f"{node!r} is not running"
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                state = client.sentinel_master(self.master_name)
            replicas, others = state["num-slaves"], state["num-other-sentinels"]
            if replicas < len(self.replicas) or others < len(self.sentinels) - 1:
                return f"sentinel {sentinel.port} sees {replicas} replicas, {others} sentinels"
        for replica in self.replicas:
            with replica.client() as client:
                link = client.info("replication").get("master_link_status")
            if link != "up":
                return f"replica {replica.port} has master_link_status:{link}"
        return None

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        reason: str | None = "not checked"
        while True:
            try:
                reason = self._not_ready_reason()
            except (redis.RedisError, OSError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if reason is None:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(_POLL_INTERVAL_S)
        raise Unavailable(
            f"redis sentinel group {self.master_name!r}: gave up waiting for the sentinels to "
            f"see the replicas and each other after {self.ready_timeout_s:g}s: {reason}\n"
            f"{self.logs()}"
        )


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-_LOG_TAIL_CHARS:] or "(log empty)"
    except OSError as exc:
        return f"(log unreadable: {exc})"
