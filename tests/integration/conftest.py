"""Integration fixtures: a real Redis, a real Celery worker, the real api over HTTP."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from celery import Celery
from celery.contrib.testing.worker import start_worker

from switchboard.api.app import create_app
from switchboard.shared.config import Settings, SwitchboardConfig, parse_config
from switchboard.shared.errors import Unavailable
from switchboard.shared.services import Services
from switchboard.supervisor.redis_server import find_redis_server
from switchboard.workers.app import create_celery_app
from switchboard.workers.pool import TaskPool
from switchboard.workers.run_host import run_host
from switchboard_testkit.procs import stop_groups, wait_healthy
from switchboard_testkit.redis_cluster import RedisClusterGroup

TOKEN = "test-token"


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def config_data() -> dict[str, Any]:
    """The JSON config for the test (override in a test module to change it)."""
    return {}


@pytest.fixture
def config(config_data: dict[str, Any]) -> SwitchboardConfig:
    """The validated config."""
    return parse_config(config_data)


@pytest.fixture
def settings(redis_url: str, tmp_path: Any) -> Settings:
    """Settings pointing at the private Redis, with fast recovery timings."""
    return Settings(
        redis_url=redis_url,
        token=TOKEN,
        data_dir=tmp_path / "data",
        sweep_interval_s=0.5,
        lane_lease_s=3,
    )


@pytest.fixture
def celery_app(settings: Settings, config: SwitchboardConfig) -> Celery:
    """The product's Celery app, wired to the private Redis."""
    return create_celery_app(settings)


@pytest.fixture
def services(celery_app: Celery, settings: Settings, config: SwitchboardConfig) -> Services:
    """The worker-side services (the same object the worker's tasks use)."""
    from switchboard.wiring import build_services
    from switchboard.workers.queue import CeleryQueue

    svc = build_services(settings, queue=CeleryQueue(celery_app), config=config)
    celery_app.services_override = svc  # type: ignore[attr-defined]
    return svc


@pytest.fixture
def worker(celery_app: Celery, services: Services) -> Iterator[Any]:
    """A real Celery worker (the product's threads pool) consuming from the private Redis."""
    with start_worker(
        celery_app,
        pool=TaskPool,
        concurrency=16,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=30,
    ) as w:
        yield w
    # Celery's test worker sends no `worker_shutdown`: stop its run loops (their
    # store threads, and its outbox clears) here, as the signal does in a worker process.
    host = run_host(celery_app)
    if host is not None:
        host.close()


@pytest.fixture
def api_url(settings: Settings, config: SwitchboardConfig, services: Services) -> Iterator[str]:
    """The real api served by uvicorn on a loopback port."""
    port = free_port()
    app = create_app(settings, config, services=services)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("api did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def client(api_url: str) -> Iterator[httpx.Client]:
    """An HTTP client for the api with the bearer token."""
    with httpx.Client(
        base_url=api_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    ) as c:
        yield c


@pytest.fixture
def rpc(client: httpx.Client) -> Callable[..., Any]:
    """Call a gateway method and return the decoded answer (asserting HTTP 200)."""

    def call(method: str, **params: Any) -> Any:
        resp = client.post("/rpc", json={"method": method, "params": params})
        assert resp.status_code == 200, resp.text
        return resp.json()

    return call


@pytest.fixture
def sweeper(services: Services) -> Iterator[None]:
    """The recovery sweep every 0.3 s in a thread (what beat schedules in production)."""
    from switchboard.shared.flows.sweeper import sweep

    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.3):
            sweep(services)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(5)


class SwitchboardProcesses:
    """Starts `switchboard <command>` subprocesses, each in its own process group, logging
    to ``<log_dir>/<command>-<n>.log``; `env` may be changed before a start."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.started: list[subprocess.Popen[bytes]] = []

    def __call__(self, *args: str) -> subprocess.Popen[bytes]:
        """Start `switchboard <args>`."""
        log = open(self.log_dir / f"{args[0]}-{len(self.started)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "switchboard", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started.append(proc)
        return proc

    @contextlib.contextmanager
    def serving(
        self, *, beat: bool = True, concurrency: int = 2
    ) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
        """An api on a free port, a worker and (unless ``beat`` is False) a beat: yields
        (the api's URL, the processes) once the api answers, and stops them (SIGTERM, as
        for a restart) on leaving."""
        port = free_port()
        procs = [
            self("api", "--port", str(port)),
            self("worker", "--concurrency", str(concurrency)),
        ]
        if beat:
            procs.append(self("beat"))
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, procs)
            yield url, procs
        finally:
            stop_groups(procs, timeout_s=15)

    def kill_all(self) -> None:
        """kill -9 every process group still running."""
        for proc in self.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def switchboard_procs(redis_url: str, tmp_path: Path) -> Iterator[SwitchboardProcesses]:
    """Worker and beat subprocesses on this test's Redis with a 2 s lane lease and a sweep
    every 0.5 s (so a killed worker's run is recovered quickly); all killed at teardown."""
    env = {
        **os.environ,
        "SWITCHBOARD_REDIS_URL": redis_url,
        "SWITCHBOARD_TOKEN": "t",
        "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
        "SWITCHBOARD_LANE_LEASE_S": "2",
        "SWITCHBOARD_SWEEP_INTERVAL_S": "0.5",
        "SWITCHBOARD_LOG_LEVEL": "WARNING",
    }
    env.pop("SWITCHBOARD_CONFIG", None)
    procs = SwitchboardProcesses(env, tmp_path)
    yield procs
    procs.kill_all()


# --- a private Redis Cluster (the cluster and routing tests) ---------------------------------


def _started_cluster(where: Path) -> Iterator[RedisClusterGroup]:
    """Three primaries with a replica each, on ports of their own; skipped where no
    redis-server can run one."""
    try:
        find_redis_server()
    except Unavailable as exc:
        pytest.skip(f"no redis-server to run a Redis Cluster: {exc}")
    with RedisClusterGroup(where, primaries=3, replicas_per_primary=1) as group:
        yield group


@pytest.fixture(scope="module")
def steady_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterGroup]:
    """A cluster the module's tests that fail nothing over share."""
    yield from _started_cluster(tmp_path_factory.mktemp("steady-cluster"))


@pytest.fixture
def cluster_group(tmp_path: Path) -> Iterator[RedisClusterGroup]:
    """A cluster of the test's own (a failover changes which node owns what)."""
    yield from _started_cluster(tmp_path / "cluster")
