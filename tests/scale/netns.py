"""A network namespace joined to the host by a veth pair, for partition tests: a process
started in it reaches the host only through the pair, which the test cuts (the host end
downed: the namespace's packets go nowhere, as behind a failed switch) and heals.

Needs root and `ip netns`; `why_not()` says why a machine cannot (the test skips). Names
and the /30 are picked per use so runs side by side do not meet; `Partition.close()`
removes everything it made, whatever failed before.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from faultkit import Cluster, Proc, wait_until

from switchboard.supervisor.redis_server import RedisServer

# The /30s are picked in this range (the host end takes .1, the namespace end .2).
_NETWORK = ipaddress.ip_network("10.213.0.0/16")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def why_not() -> str | None:
    """Why this machine cannot run a partition test, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and veth pairs)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"sbprobe{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns` is not available here: {made.stderr.strip()[:100]}"
    _ip("netns", "del", probe, check=False)
    return None


def _free_slash30() -> tuple[str, str]:
    """A /30 in `_NETWORK` no address on this host is in: (host end, namespace end)."""
    taken = _ip("-4", "-o", "addr", "show").stdout
    for _ in range(100):
        index = secrets.randbelow(_NETWORK.num_addresses // 4)
        base = _NETWORK.network_address + index * 4
        host, inner = str(base + 1), str(base + 2)
        if f" {host}/" not in taken and f" {inner}/" not in taken:
            return host, inner
    raise RuntimeError("no free /30 found in 10.213.0.0/16")


class Partition:
    """A namespace `ns` and a veth pair (`host_if` on the host at `host_ip`, its peer in
    the namespace at `ns_ip`). `cut()` downs the host end; `heal()` raises it again."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.ns = f"sbpart-{tag}"
        self.host_if = f"sbh{tag}"  # interface names: at most 15 characters
        self.ns_if = f"sbn{tag}"
        self.host_ip, self.ns_ip = _free_slash30()
        self.cuts = 0

    def open(self) -> None:
        """Make the namespace and the pair, both ends up with their addresses."""
        _ip("netns", "add", self.ns)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _ip("link", "set", self.ns_if, "netns", self.ns)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        inside = ("netns", "exec", self.ns, "ip")
        _ip(*inside, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        _ip(*inside, "link", "set", self.ns_if, "up")
        _ip(*inside, "link", "set", "lo", "up")

    def close(self) -> None:
        """Remove the namespace (its end of the pair goes with it) and the host end;
        safe to call twice, and after a failed `open`."""
        _ip("netns", "del", self.ns, check=False)
        _ip("link", "del", self.host_if, check=False)

    def exists(self) -> bool:
        """The namespace or the host end is still there."""
        listed = _ip("netns", "list", check=False).stdout.split()
        return self.ns in listed or _ip("link", "show", self.host_if, check=False).returncode == 0

    def cut(self) -> None:
        """Cut the namespace off: the host end of the pair goes down."""
        _ip("link", "set", self.host_if, "down")
        self.cuts += 1

    def heal(self) -> None:
        """Join it again."""
        _ip("link", "set", self.host_if, "up")

    def prefix(self) -> list[str]:
        """The argv prefix that runs a command in the namespace."""
        return ["ip", "netns", "exec", self.ns]

    def __enter__(self) -> Partition:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SharedRedisServer(RedisServer):
    """A private redis-server that also listens on ``extra`` (the host end of a pair), so
    a process in the namespace reaches it; protected mode off (no password, not only
    loopback clients)."""

    def __init__(self, data_dir: Path, extra: str) -> None:
        super().__init__(data_dir)
        self.extra = extra

    def _argv(self) -> list[str]:
        argv = super()._argv()
        at = argv.index("--bind")
        argv[at + 1 : at + 2] = ["127.0.0.1", self.extra]
        return [*argv, "--protected-mode", "no"]

    def url_at(self, host: str, db: int = 0) -> str:
        """The redis:// URL of database ``db`` reached at ``host``."""
        return f"redis://{host}:{self.port}/{db}"


def worker_in(
    cluster: Cluster,
    partition: Partition,
    env: Mapping[str, str],
    *,
    concurrency: int,
    node: str,
) -> Proc:
    """`switchboard worker` in the namespace (``env`` laid over the cluster's: its Redis
    URL at the host end), one of the cluster's processes; returned once it consumes."""
    log = cluster.workdir / f"{len(cluster.procs):02d}-worker-netns.log"
    argv = [sys.executable, "-m", "switchboard", "worker", "--concurrency", str(concurrency)]
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [*partition.prefix(), *argv, "--node", node],
            env={**cluster.env, **env},
            cwd=cluster.workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = Proc("worker-netns", popen, log)
    cluster.procs.append(proc)

    def ready() -> bool:
        assert proc.alive(), f"the worker in {partition.ns} exited:\n{proc.output()[-3000:]}"
        return " ready." in proc.output()

    wait_until(ready, 60, f"the worker in {partition.ns} to be ready", 0.2)
    return proc
