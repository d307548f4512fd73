"""Starting what a benchmark needs: a private Redis, product processes, the anchor worker.

Every process is a real subprocess started as a user would start it (`switchboard api`,
`switchboard worker`, `switchboard beat`, `celery -A switchboard.bench.anchor worker`), all
pointed at one private redis-server; the scenario drives them from the bench process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from celery import Celery
from redis import Redis
from rich.progress import Progress

from switchboard.bench import anchor
from switchboard.shared.config import Settings, load_config
from switchboard.shared.errors import Unavailable
from switchboard.shared.services import Services
from switchboard.supervisor.redis_server import RedisServer, redis_free_port

TOKEN = "bench-token"
WORKER_CONCURRENCY = 64
# The stack the latency, throughput, listing and history scenarios share: one agent,
# visibility `agent`, no reply-back ping-pong, the anchor worker beside the product's.
ONE_AGENT_STACK: dict[str, Any] = {
    "config": {
        "session": {"agentToAgent": {"maxPingPongTurns": 0}},
        "tools": {"sessions": {"visibility": "agent"}},
    },
    "worker_concurrency": WORKER_CONCURRENCY,
    "anchor_concurrency": WORKER_CONCURRENCY,
}
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0


@dataclass
class Stack:
    """A running set of processes for one benchmark."""

    redis: RedisServer
    api_url: str
    workdir: Path
    env: dict[str, str]
    config_path: Path | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Set when a scenario failed on this stack: its work dir (logs) is kept.
    keep_logs: bool = False

    def spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start a process with the stack's environment, logging to ``<workdir>/<name>.log``."""
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(list(argv), env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()  # the child holds its own descriptor
        self.procs[name] = proc
        return proc

    def pid(self, name: str) -> int:
        """The process id of a started process (``api``, ``worker0``, ``anchor``, …)."""
        return self.procs[name].pid

    def check_alive(self) -> None:
        """Raise `Unavailable` naming a process that exited, with the tail of its log."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise Unavailable(
                    f"bench process {name} exited with code {proc.returncode}:\n"
                    + log_tail(self.workdir / f"{name}.log")
                )

    def http(self) -> httpx.Client:
        """A client for the api with the bench token."""
        return httpx.Client(
            base_url=self.api_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
        )

    def async_http(self, connections: int = 64) -> aiohttp.ClientSession:
        """An async client for the api with the bench token, for bursts of requests.

        aiohttp rather than httpx: on two cores the load generator shares the CPU with the
        stack under test, and httpx's async client took about 4 ms of CPU per request
        (aiohttp well under 1 ms), a quarter of all the CPU a burst of sends used."""
        return aiohttp.ClientSession(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=aiohttp.ClientTimeout(total=300),
            connector=aiohttp.TCPConnector(limit=connections),
        )

    def client(self) -> Redis:
        """A Redis client for the stack's database (no retries, generous timeout)."""
        return Redis.from_url(self.redis.url, socket_timeout=120)

    def settings(self) -> Settings:
        """The settings the stack's processes run with."""
        return Settings(
            redis_url=self.redis.url,
            token=TOKEN,
            data_dir=Path(self.env["SWITCHBOARD_DATA_DIR"]),
            config=self.config_path,
            log_level="WARNING",
        )

    def services(self) -> Services:
        """The product's services wired in the bench process, against the stack's Redis."""
        from switchboard.wiring import build_services
        from switchboard.workers.app import create_celery_app
        from switchboard.workers.queue import CeleryQueue

        settings = self.settings()
        queue = CeleryQueue(create_celery_app(settings))
        return build_services(settings, queue=queue, config=load_config(self.config_path))

    def anchor_app(self) -> Celery:
        """The anchor Celery app, as a client of the stack's Redis."""
        return anchor.create_app(self.redis.url)

    def rpc(self, http: httpx.Client, method: str, **params: Any) -> dict[str, Any]:
        """Call an api method; raise `Unavailable` with the api's error on failure."""
        resp = http.post("/rpc", json={"method": method, "params": params})
        if resp.status_code != 200:
            raise Unavailable(f"rpc {method} answered {resp.status_code}: {resp.text[:300]}")
        out: dict[str, Any] = resp.json()
        return out

    def tool(self, http: httpx.Client, tool: str, session_key: str, **args: Any) -> dict[str, Any]:
        """Invoke a session tool over `/tools/invoke`; the tool's result."""
        body = {"tool": tool, "args": args, "sessionKey": session_key}
        resp = http.post("/tools/invoke", json=body)
        if resp.status_code != 200:
            raise Unavailable(f"tool {tool} answered {resp.status_code}: {resp.text[:300]}")
        result: dict[str, Any] = resp.json()["result"]
        return result

    def wait_idle(self, timeout_s: float = 120.0) -> float:
        """Wait until no task is queued or in flight and no run is active; seconds waited.

        Follow-up work (announces, deliveries) of one measurement would otherwise run
        during the next one."""
        from switchboard.shared.store.keyspace import Keyspace
        from switchboard.workers.app import ALL_QUEUES

        ks = Keyspace(self.settings().key_prefix)
        t0 = time.monotonic()
        quiet = 0
        with self.client() as r:
            while quiet < 3:
                if time.monotonic() - t0 > timeout_s:
                    raise Unavailable(f"the worker did not go idle within {timeout_s:.0f}s")
                pipe = r.pipeline(transaction=False)
                for name in ALL_QUEUES:
                    pipe.llen(name)
                pipe.hlen("unacked")
                pipe.zcard(ks.active_runs)
                pipe.zcard(ks.outbox)
                pipe.zcard(ks.parked_runs)
                busy = sum(int(n) for n in pipe.execute())
                quiet = quiet + 1 if busy == 0 else 0
                time.sleep(0.1)
        return time.monotonic() - t0

    def warm_up(self, *, session_key: str = "agent:main:bench-warmup") -> None:
        """One agent run end to end (the worker is up, imports done, clients connected)."""
        with self.http() as http:
            started = self.rpc(http, "agent", sessionKey=session_key, message="warm up")
            outcome = self.rpc(http, "agent.wait", runId=started["runId"], timeoutMs=60_000)
        if outcome.get("status") != "ok":
            self.check_alive()
            raise Unavailable(f"warm-up run did not succeed: {outcome}")

    def warm_up_anchor(self, app: Celery) -> None:
        """One no-op task end to end on the anchor worker."""
        app.tasks[anchor.NOOP].delay().get(timeout=START_TIMEOUT_S)


@contextmanager
def stack(
    *,
    config: Mapping[str, Any] | None = None,
    worker_concurrency: int = 64,
    workers: int = 1,
    anchor_concurrency: int | None = None,
    beat: bool = False,
    keep: bool = False,
) -> Iterator[Stack]:
    """Private Redis + api + worker(s) (+ beat, + the anchor worker), torn down afterwards.

    ``anchor_concurrency`` None starts no anchor worker; ``workers`` 0 starts none. Beat
    (the recovery sweep) is off by default: nothing fails on purpose in a benchmark.
    """
    workdir = Path(tempfile.mkdtemp(prefix="switchboard-bench-"))
    redis_server = RedisServer(workdir / "redis", appendonly=False)
    redis_server.start()
    port = redis_free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")},
        "SWITCHBOARD_REDIS_URL": redis_server.url,
        "SWITCHBOARD_TOKEN": TOKEN,
        "SWITCHBOARD_DATA_DIR": str(workdir / "data"),
        "SWITCHBOARD_LOG_LEVEL": "WARNING",
    }
    config_path = None
    if config is not None:
        config_path = workdir / "switchboard.json5"
        config_path.write_text(json.dumps(config, indent=2))
        env["SWITCHBOARD_CONFIG"] = str(config_path)
    st = Stack(
        redis=redis_server,
        api_url=f"http://127.0.0.1:{port}",
        workdir=workdir,
        env=env,
        config_path=config_path,
    )
    me = [sys.executable, "-m", "switchboard"]
    ok = False
    try:
        st.spawn("api", [*me, "api", "--port", str(port)])
        for i in range(workers):
            st.spawn(f"worker{i}", [*me, "worker", "--concurrency", str(worker_concurrency)])
        if beat:
            st.spawn("beat", [*me, "beat"])
        if anchor_concurrency is not None:
            st.spawn("anchor", _anchor_argv(anchor_concurrency))
        _wait_http(st, f"{st.api_url}/healthz", START_TIMEOUT_S)
        yield st
        ok = True
    finally:
        for proc in st.procs.values():
            proc.kill()  # a private, throw-away stack: no graceful shutdown to wait for
        for proc in st.procs.values():
            proc.wait()
        redis_server.stop()
        if ok and not keep and not st.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def fake_model(latency_ms: float) -> Iterator[str]:
    """The project's fake OpenAI-compatible model server as a subprocess; yields its base URL."""
    port = redis_free_port()
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    argv = [sys.executable, "-m", "switchboard.testing.fake_model", "--port", str(port)]
    argv += ["--latency-ms", str(latency_ms)]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(f"{url}/v1/models"):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                raise Unavailable(f"the fake model server did not start:\n{tail}")
            time.sleep(0.1)
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _anchor_argv(concurrency: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "switchboard.bench.anchor",
        "worker",
        "-P",
        "threads",
        "-c",
        str(concurrency),
        "-Q",
        anchor.QUEUE,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "WARNING",
    ]


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=1).status_code == 200
    return False


def _wait_http(st: Stack, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _answers(url):
            return
        st.check_alive()
        time.sleep(0.2)
    raise Unavailable(f"{url} did not answer within {timeout_s:.0f}s")


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(text[-lines:]) or "(log empty)"


@contextmanager
def phase(progress: Progress, label: str) -> Iterator[None]:
    """A spinner line on the progress display for one untimed step (setup, teardown)."""
    task = progress.add_task(label, total=None)
    try:
        yield
    finally:
        progress.update(task, total=1, completed=1)
        progress.remove_task(task)


class Stacks:
    """The stacks of one bench run: consecutive scenarios asking for the same options share
    one (starting four processes costs many seconds on a busy machine)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self._options: dict[str, Any] | None = None
        self._exits = contextlib.ExitStack()
        self._current: Stack | None = None

    def get(self, name: str, **options: Any) -> Stack:
        """A running stack with these `stack()` options (the current one if they match)."""
        if self._current is not None and options == self._options:
            self._current.check_alive()
            return self._current
        self.close()
        with phase(self.progress, f"{name}: start processes"):
            self._current = self._exits.enter_context(stack(**options))
        self._options = options
        return self._current

    def close(self, *, keep_logs: bool = False) -> Path | None:
        """Stop the current stack, if any; with ``keep_logs`` its work dir stays (returned)."""
        if self._current is None:
            return None
        workdir = self._current.workdir
        self._current.keep_logs = keep_logs
        with phase(self.progress, "stop processes"):
            self._current = self._options = None
            self._exits.close()
        return workdir if keep_logs else None

    def __enter__(self) -> Stacks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass(frozen=True)
class BenchRun:
    """What a scenario gets: the progress display, the mode and the shared stacks."""

    progress: Progress
    quick: bool
    stacks: Stacks
