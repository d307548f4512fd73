"""Starting what a benchmark needs: a private Redis, product processes, the anchor worker."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from switchboard.supervisor.redis_server import RedisServer, redis_free_port

TOKEN = "bench-token"


@dataclass
class Stack:
    """A running set of processes for one benchmark."""

    redis: RedisServer
    api_url: str
    workdir: Path
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start a process with the stack's environment, logging to the work dir."""
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(list(argv), env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def http(self) -> httpx.Client:
        """A client for the api with the bench token."""
        return httpx.Client(
            base_url=self.api_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
        )


@contextmanager
def stack(
    *,
    worker_concurrency: int = 64,
    workers: int = 1,
    anchor: bool = True,
    config: Path | None = None,
) -> Iterator[Stack]:
    """Private Redis + api + worker(s) (+ the anchor worker), torn down afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="switchboard-bench-"))
    redis = RedisServer(workdir / "redis", appendonly=False)
    redis.start()
    port = redis_free_port()
    env = {
        **os.environ,
        "SWITCHBOARD_REDIS_URL": redis.url,
        "SWITCHBOARD_TOKEN": TOKEN,
        "SWITCHBOARD_DATA_DIR": str(workdir / "data"),
        "SWITCHBOARD_LOG_LEVEL": "WARNING",
    }
    if config is not None:
        env["SWITCHBOARD_CONFIG"] = str(config)
    st = Stack(redis=redis, api_url=f"http://127.0.0.1:{port}", workdir=workdir, env=env)
    me = [sys.executable, "-m", "switchboard"]
    try:
        st.spawn("api", [*me, "api", "--port", str(port)])
        for i in range(workers):
            st.spawn(f"worker{i}", [*me, "worker", "--concurrency", str(worker_concurrency)])
        if anchor:
            st.spawn(
                "anchor",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "switchboard.bench.anchor",
                    "worker",
                    "-P",
                    "threads",
                    "-c",
                    str(worker_concurrency),
                    "-Q",
                    "anchor",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "-l",
                    "WARNING",
                ],
            )
        _wait_http(f"{st.api_url}/healthz", 60)
        yield st
    finally:
        for proc in st.procs:
            proc.terminate()
        for proc in st.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        redis.stop()


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s")
