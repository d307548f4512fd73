"""`switchboard up --apis 2 --workers 2`: two api processes serve one port, two workers
(distinct node names) share the runs, waits answer on whichever api holds them, and Ctrl-C
stops every process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil
import pytest

from switchboard_testkit.up import UpProcess, clean_env, start_up

pytestmark = [pytest.mark.scale, pytest.mark.timeout(240)]

RUNS = 12


@pytest.fixture
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    """`up --apis 2 --workers 2`, each worker 4 runs at a time, embedded Redis."""
    workdir = tmp_path_factory.mktemp("up-scale")
    with start_up(workdir, {}, concurrency=4, args=("--apis", "2", "--workers", "2")) as started:
        yield started


def _children(up: UpProcess) -> dict[str, list[psutil.Process]]:
    """up's direct children by role (api, worker, beat, redis)."""
    found: dict[str, list[psutil.Process]] = {}
    for child in psutil.Process(up.proc.pid).children():
        line = " ".join(child.cmdline())
        role = next((r for r in ("api", "worker", "beat") if f"switchboard {r}" in line), "")
        found.setdefault(role or ("redis" if "redis" in line else "other"), []).append(child)
    return found


def _ended_by(up: UpProcess) -> Counter[str]:
    """How many `run … ended` lines each of up's prefixed children printed."""
    counts: Counter[str] = Counter()
    for line in list(up.lines):
        name, sep, rest = line.partition(" | ")
        if sep and rest.startswith("{"):
            try:
                event = json.loads(rest).get("event", "")
            except ValueError:
                continue
            if re.match(r"run \S+ ended: ", event):
                counts[name.strip()] += 1
    return counts


def _wait_serving(up: UpProcess, names: set[str], timeout_s: float = 90) -> None:
    """Wait until each of these prefixed children (`api-1`, …) has started serving: up's
    /healthz answers once one api does, and the kernel gives a port's connections only to
    the processes listening on it."""
    deadline = time.monotonic() + timeout_s
    serving: set[str] = set()
    while serving < names and time.monotonic() < deadline:
        serving = {
            name.strip()
            for line in list(up.lines)
            for name, _, rest in [line.partition(" | ")]
            if "Application startup complete." in rest
        }
        time.sleep(0.2)
    assert serving >= names, f"serving: {sorted(serving)}, not yet: {sorted(names - serving)}"


def _connections_on(process: psutil.Process, port: int) -> int:
    return sum(
        1
        for c in process.net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port
    )


def test_two_apis_on_one_port_and_two_workers(up: UpProcess) -> None:
    """12 waits held open at once are spread over both api processes on the one port; the
    runs they wait for execute on both workers; every wait answers its run's reply."""
    children = _children(up)
    assert len(children.get("api", [])) == 2, children
    assert len(children.get("worker", [])) == 2 and len(children.get("beat", [])) == 1
    apis = children["api"]
    assert all("--reuse-port" in a.cmdline() for a in apis)
    nodes = sorted(c.cmdline()[c.cmdline().index("--node") + 1] for c in children["worker"])
    assert nodes == ["worker1@%h", "worker2@%h"], nodes
    port = int(up.url.rsplit(":", 1)[1])
    headers = {"Authorization": f"Bearer {up.token}"}
    _wait_serving(up, {"api-1", "api-2"})

    def wait_for(i: int) -> Any:
        # A client of its own per wait: its own connection, placed by the kernel.
        with httpx.Client(base_url=up.url, headers=headers, timeout=60) as http:
            body = {"sessionKey": f"agent:main:hook:up-{i}", "message": f"/sleep 3\nup {i}"}
            started = http.post("/rpc", json={"method": "agent", "params": body}).json()
            params = {"runId": started["runId"], "timeoutMs": 60_000}
            return http.post("/rpc", json={"method": "agent.wait", "params": params}).json()

    with ThreadPoolExecutor(RUNS) as pool:
        waits = [pool.submit(wait_for, i) for i in range(RUNS)]
        time.sleep(1.5)  # every wait is open now: its run sleeps 3 s
        held = [_connections_on(api, port) for api in apis]
        outcomes = [w.result() for w in waits]
    print(f"\nwaits held by the two api processes: {held}")
    if sys.platform == "linux":  # elsewhere SO_REUSEPORT does not spread connections
        assert all(n > 0 for n in held), held
    assert [o.get("status") for o in outcomes] == ["ok"] * RUNS, outcomes
    assert [o.get("reply") for o in outcomes] == [f"up {i}" for i in range(RUNS)]
    deadline = time.monotonic() + 10
    while set(_ended_by(up)) < {"worker-1", "worker-2"} and time.monotonic() < deadline:
        time.sleep(0.2)
    ended = _ended_by(up)
    print(f"runs ended by worker: {dict(ended)}")
    assert {"worker-1", "worker-2"} <= set(ended), ended

    # `check-health --worker` beside it pings both numbered workers (no celery@host runs).
    health = subprocess.run(
        [sys.executable, "-m", "switchboard", "check-health", "--worker"],
        cwd=up.workdir,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert health.returncode == 0, health.stderr
    assert health.stdout.strip() == "healthy"

    # A second `up --apis 2` on the same port (another directory) is refused at once: its
    # apis would otherwise join this one's SO_REUSEPORT group.
    other = up.workdir.parent / f"{up.workdir.name}-second"
    other.mkdir()
    second = subprocess.run(
        [sys.executable, "-m", "switchboard", "up", "--apis", "2", "--port", str(port)],
        cwd=other,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1, second
    assert "cannot listen" in second.stderr and "in use" in second.stderr, second.stderr

    every = [c for group in children.values() for c in group]
    os.kill(up.proc.pid, signal.SIGINT)
    up.proc.wait(timeout=40)
    _, alive = psutil.wait_procs(every, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{up.url}/healthz", timeout=2)
