"""Starting what a benchmark needs: a private Redis, product processes, the anchor workers.

Every process is a real subprocess started as a user would start it (`switchboard api`,
`switchboard worker`, `switchboard beat`, `celery -A switchboard_bench.anchor worker`), all
pointed at one private redis-server (each anchor on a database of its own), or with the
product's state on a private Redis Cluster and its broker on that redis-server; the scenario
drives them from the bench process, and reaches the product's data only through the
product's store (`Stack.store`).
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
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil
from celery import Celery
from rich.progress import Progress

from switchboard.shared.config import Settings, load_config
from switchboard.shared.errors import Unavailable
from switchboard.shared.services import Services
from switchboard.shared.store import Store
from switchboard.shared.store.stats import CommandCalls, ProgressReads, ServerStats
from switchboard.supervisor.redis_server import RedisServer, redis_free_port
from switchboard_bench import anchor
from switchboard_testkit.redis_cluster import RedisClusterGroup

TOKEN = "bench-token"
WORKER_CONCURRENCY = 64
# The stack the latency, throughput, listing and history scenarios share: one agent,
# visibility `agent`, no reply-back ping-pong, both anchor workers beside the product's.
ONE_AGENT_STACK: dict[str, Any] = {
    "config": {
        "session": {"agentToAgent": {"maxPingPongTurns": 0}},
        "tools": {"sessions": {"visibility": "agent"}},
    },
    "worker_concurrency": WORKER_CONCURRENCY,
    "anchors": True,
}
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
# The names of a stack's Redis servers in `Stack.process_tree` and `Stack.command_calls`:
# its own redis-server, and every node of the cluster the state is on (if it is).
REDIS = "redis"
STATE_CLUSTER = "redis-cluster"


@dataclass
class Stack:
    """A running set of processes for one benchmark."""

    redis: RedisServer
    api_url: str
    workdir: Path
    env: dict[str, str]
    config_path: Path | None = None
    worker_concurrency: int = WORKER_CONCURRENCY
    # The Celery broker when it is not the stack's Redis (RabbitMQ: ``amqp://…/<vhost>``).
    broker_url: str | None = None
    # The private Redis Cluster the product's state is on, when it is not on the stack's
    # Redis (the product's broker and the anchors then stay on the stack's Redis).
    cluster: RedisClusterGroup | None = None
    # SWITCHBOARD_SLOT_GROUPS of every product process (None: the setting's default, 64 on
    # a cluster and 1 on one Redis).
    slot_groups: int | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Set when a scenario failed on this stack: its work dir (logs) is kept.
    keep_logs: bool = False
    # Redis commands the bench itself sent while polling (left out of per-run counts).
    polled_commands: Counter[str] = field(default_factory=Counter)
    _store: Store | None = field(default=None, repr=False)
    # A held connection to each Redis server read with INFO (by port), for `command_calls`.
    _servers: dict[int, ServerStats] = field(default_factory=dict, repr=False)

    def spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a process with the stack's environment (plus ``env``), logging to
        ``<workdir>/<name>.log``."""
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            list(argv), env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT
        )
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

    def store(self) -> Store:
        """The product's store (on the stack's Redis or on the cluster, cut into the slot
        groups the processes use), for the bench's own reads (one per stack)."""
        if self._store is None:
            settings = self.settings()
            assert settings.redis_url is not None
            self._store = Store.from_url(
                settings.redis_url,
                prefix=settings.key_prefix,
                groups=settings.groups,
            )
        return self._store

    def close(self) -> None:
        """Close the bench's own store client and its connections to the Redis servers."""
        if self._store is not None:
            self._store.close()
            self._store = None
        for stats in self._servers.values():
            stats.redis.close()
        self._servers.clear()

    @property
    def state_url(self) -> str:
        """The product's state store: the cluster's URL when the state is on one, else the
        stack's Redis."""
        return self.cluster.url if self.cluster is not None else self.redis.url

    @property
    def product_broker_url(self) -> str | None:
        """The product's Celery broker when it is not the state's Redis: `broker_url`, else
        the stack's Redis when the state is on a cluster (which cannot be a broker)."""
        if self.broker_url is not None:
            return self.broker_url
        return self.redis.url if self.cluster is not None else None

    def settings(self) -> Settings:
        """The settings the stack's processes run with."""
        return Settings(
            redis_url=self.state_url,
            token=TOKEN,
            data_dir=Path(self.env["SWITCHBOARD_DATA_DIR"]),
            config=self.config_path,
            log_level="WARNING",
            broker_url=self.product_broker_url,
            slot_groups=self.slot_groups,  # not the bench's own environment's
        )

    def redis_servers(self, names: Sequence[str]) -> list[RedisServer]:
        """The Redis servers among ``names``: ``redis`` the stack's own, ``redis-cluster``
        every node of the cluster the state is on (none when it is not on one)."""
        out: list[RedisServer] = []
        for name in names:
            if name == REDIS:
                out.append(self.redis)
            elif name == STATE_CLUSTER and self.cluster is not None:
                out += self.cluster.nodes
        return out

    def process_tree(self, names: Sequence[str]) -> list[psutil.Process]:
        """The named processes with their children, for CPU use (``redis`` and
        ``redis-cluster`` name the Redis servers, as `redis_servers` says)."""
        pids: list[int | None] = []
        for name in names:
            if name in (REDIS, STATE_CLUSTER):
                pids += [server.pid for server in self.redis_servers([name])]
            else:
                pids.append(self.pid(name))
        out: list[psutil.Process] = []
        for pid in pids:
            if pid is None:
                raise Unavailable("bench: a redis-server of the stack is not running")
            proc = psutil.Process(pid)
            out += [proc, *proc.children(recursive=True)]
        return out

    def command_calls(self, names: Sequence[str]) -> CommandCalls:
        """Calls per command since start (``INFO commandstats``), summed over the Redis
        servers among ``names`` (`redis_servers`), each read on a connection held for it."""
        total: Counter[str] = Counter()
        for calls in self.calls_by_server(names).values():
            total.update(calls.calls)
        return CommandCalls(dict(total))

    def calls_by_server(self, names: Sequence[str]) -> dict[int, CommandCalls]:
        """Calls per command since start of each Redis server among ``names``, by port."""
        return {s.port: self._server(s).command_calls() for s in self.redis_servers(names)}

    def _server(self, server: RedisServer) -> ServerStats:
        stats = self._servers.get(server.port)
        if stats is None:
            stats = self._servers[server.port] = ServerStats(server.client())
        return stats

    def services(self) -> Services:
        """The product's services wired in the bench process, against the stack's state store."""
        from switchboard.wiring import build_services
        from switchboard.workers.app import create_celery_app
        from switchboard.workers.queue import CeleryQueue

        settings = self.settings()
        queue = CeleryQueue(create_celery_app(settings))
        return build_services(settings, queue=queue, config=load_config(self.config_path))

    def anchor_apps(self) -> dict[str, Celery]:
        """A client of each anchor worker's app (shape name → app), as its user would hold."""
        return {
            s.name: anchor.create_app(s.url(self.redis.url), broker=self.broker_url)
            for s in self.anchors()
        }

    def anchors(self) -> tuple[anchor.AnchorShape, ...]:
        """The anchor workers this stack runs (both shapes, or none)."""
        return tuple(s for s in anchor.shapes(self.worker_concurrency) if s.process in self.procs)

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
        t0 = time.monotonic()
        quiet = 0
        while quiet < 3:
            if time.monotonic() - t0 > timeout_s:
                raise Unavailable(f"the worker did not go idle within {timeout_s:.0f}s")
            busy = self.backlog()
            quiet = quiet + 1 if busy == 0 else 0
            time.sleep(0.1)
        return time.monotonic() - t0

    def settle(self, timeout_s: float = 10.0) -> None:
        """Return once nothing is queued, in flight or active (two polls 2 ms apart): a
        short wait between timed samples, so no sample pays for the last one's follow-up."""
        deadline = time.monotonic() + timeout_s
        quiet = 0
        while quiet < 2 and time.monotonic() < deadline:
            busy = self.backlog()
            quiet = quiet + 1 if busy == 0 else 0
            time.sleep(0.002)

    def backlog(self) -> int:
        """Work not yet done (`ProgressReads.backlog`: messages queued or unacked on the
        product's queues, active and parked runs, outbox entries); a counted poll. With the
        state on a cluster the queues are read on the broker (the stack's Redis) and the rest
        in the store (a key of another slot is not on the store's node)."""
        from switchboard.workers.app import ALL_QUEUES

        store = self.store()
        self.polled_commands.update(store.progress.backlog_commands(ALL_QUEUES))
        broker = None
        if self.cluster is not None:  # the queues are on the stack's Redis, not the cluster
            broker = ProgressReads(self._server(self.redis).redis, store.ks)
        return store.progress.backlog(ALL_QUEUES, broker)

    def run_ends(self, run_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
        """The runs that have ended: id → (status, endedAt ms); a counted poll."""
        self.polled_commands["hmget"] += len(run_ids)
        return self.store().progress.run_ends(run_ids) if run_ids else {}

    def transcript_lengths(self, session_keys: Sequence[str]) -> list[int]:
        """Each session's transcript length; a counted poll."""
        self.polled_commands["xlen"] += len(session_keys)
        return self.store().progress.transcript_lengths(session_keys)

    def warm_up(self, *, session_key: str = "agent:main:bench-warmup") -> None:
        """One agent run end to end (the worker is up, imports done, clients connected)."""
        with self.http() as http:
            started = self.rpc(http, "agent", sessionKey=session_key, message="warm up")
            outcome = self.rpc(http, "agent.wait", runId=started["runId"], timeoutMs=60_000)
        if outcome.get("status") != "ok":
            self.check_alive()
            raise Unavailable(f"warm-up run did not succeed: {outcome}")

    def warm_up_anchors(self, apps: Mapping[str, Celery], rounds: int = 20) -> None:
        """A few no-op tasks end to end on each anchor worker (the first one waits for it
        to start; every pool process has run one before a figure is taken)."""
        for app in apps.values():
            for _ in range(rounds):
                app.tasks[anchor.NOOP].delay().get(timeout=START_TIMEOUT_S)


def stack_env(parent: Mapping[str, str], redis_url: str, workdir: Path) -> dict[str, str]:
    """The environment of a stack's processes: the bench's own without any ``SWITCHBOARD_``
    setting (a stack must not pick up the caller's Redis), plus the stack's."""
    return {
        **{k: v for k, v in parent.items() if not k.startswith("SWITCHBOARD_")},
        "SWITCHBOARD_REDIS_URL": redis_url,
        "SWITCHBOARD_TOKEN": TOKEN,
        "SWITCHBOARD_DATA_DIR": str(workdir / "data"),
        "SWITCHBOARD_LOG_LEVEL": "WARNING",
    }


@contextmanager
def stack(
    *,
    config: Mapping[str, Any] | None = None,
    worker_concurrency: int = 64,
    workers: int = 1,
    anchors: bool | tuple[str, ...] = False,
    beat: bool = False,
    keep: bool = False,
    apis: int = 1,
    broker_url: str | None = None,
    state_cluster: int = 0,
    slot_groups: int | None = None,
) -> Iterator[Stack]:
    """Private Redis + api(s) + worker(s) (+ beat, + the anchor workers), torn down afterwards.

    ``anchors`` starts both anchor workers (`anchor.shapes`), or those named (``("prefork",)``);
    ``workers`` 0 starts none; several (or any, with ``broker_url``) get node names of
    their own (``worker1@%h``, …).
    Several ``apis`` (processes ``api``, ``api1``, …) share the stack's one port with
    SO_REUSEPORT, as `switchboard up --apis N` runs them. ``broker_url`` puts the product's
    and the anchors' Celery broker there (RabbitMQ); the state and the anchors' results stay
    on the private Redis. ``state_cluster`` N puts the product's state on a private Redis
    Cluster of N primaries (no replicas; ``redis+cluster://``, the keys cut into slot
    groups, 64 unless ``slot_groups`` says otherwise, and so spread over every primary),
    with the product's broker on the private Redis (unless ``broker_url``) and the anchors
    there as ever. ``slot_groups`` is every product process's ``SWITCHBOARD_SLOT_GROUPS``
    (None: the setting's default).
    Beat (the recovery sweep) is off by default: nothing fails on purpose in a benchmark.
    """
    workdir = Path(tempfile.mkdtemp(prefix="switchboard-bench-"))
    redis_server = RedisServer(workdir / "redis", appendonly=False)
    redis_server.start()
    cluster = None
    if state_cluster:
        cluster = RedisClusterGroup(workdir / "cluster", primaries=state_cluster)
        try:
            cluster.start()  # stops the nodes it started when the cluster does not form
        except BaseException:
            redis_server.stop()
            raise
    port = redis_free_port()
    config_path = None
    if config is not None:
        config_path = workdir / "switchboard.json5"
        config_path.write_text(json.dumps(config, indent=2))
    st = Stack(
        redis=redis_server,
        api_url=f"http://127.0.0.1:{port}",
        workdir=workdir,
        env={},
        config_path=config_path,
        worker_concurrency=worker_concurrency,
        broker_url=broker_url,
        cluster=cluster,
        slot_groups=slot_groups,
    )
    st.env.update(stack_env(os.environ, st.state_url, workdir))
    if st.product_broker_url is not None:
        st.env["SWITCHBOARD_BROKER_URL"] = st.product_broker_url
    if slot_groups is not None:
        st.env["SWITCHBOARD_SLOT_GROUPS"] = str(slot_groups)
    if config_path is not None:
        st.env["SWITCHBOARD_CONFIG"] = str(config_path)
    me = [sys.executable, "-m", "switchboard"]
    ok = False
    try:
        serve = [*me, "api", "--port", str(port)]
        for i in range(apis):
            st.spawn(f"api{i or ''}", [*serve, "--reuse-port"] if apis > 1 else serve)
        work = [*me, "worker", "--concurrency", str(worker_concurrency)]
        # Node names of their own when several, or when the anchor shares a RabbitMQ vhost
        # (its default `celery@%h` would collide with a worker's there).
        named = workers > 1 or broker_url is not None
        for i in range(workers):
            st.spawn(f"worker{i}", [*work, "--node", f"worker{i + 1}@%h"] if named else work)
        if beat:
            st.spawn("beat", [*me, "beat"])
        for shape in anchor.shapes(worker_concurrency):
            if anchors is True or (anchors and shape.name in anchors):
                st.spawn(shape.process, _anchor_argv(shape), _anchor_env(st, shape))
        _wait_http(st, f"{st.api_url}/healthz", START_TIMEOUT_S)
        yield st
        ok = True
    finally:
        st.close()
        for proc in st.procs.values():
            proc.kill()  # a private, throw-away stack: no graceful shutdown to wait for
        for proc in st.procs.values():
            proc.wait()
        if cluster is not None:
            cluster.stop()
        redis_server.stop()
        if ok and not keep and not st.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def fake_model(latency_ms: float) -> Iterator[str]:
    """The project's fake OpenAI-compatible model server as a subprocess; yields its base URL."""
    port = redis_free_port()
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    argv = [sys.executable, "-m", "switchboard_testkit.fake_model", "--port", str(port)]
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


def _anchor_argv(shape: anchor.AnchorShape) -> list[str]:
    # The command a user types, nothing else: an anchor is Celery at its defaults (its
    # gossip, mingle and heartbeat included), never a copy tuned or slowed by the bench.
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "switchboard_bench.anchor",
        "worker",
        *shape.pool_argv,
    ]


def _anchor_env(st: Stack, shape: anchor.AnchorShape) -> dict[str, str]:
    env = {anchor.URL_ENV: shape.url(st.redis.url)}
    if st.broker_url is not None:
        env[anchor.BROKER_ENV] = st.broker_url
    return env


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
        # The fake model servers of the run, by latency (ms): kept across stacks.
        self._models: dict[float, str] = {}
        self._model_exits = contextlib.ExitStack()

    def model_server(self, latency_ms: float) -> str:
        """The base URL of the run's fake OpenAI-compatible model server answering after
        ``latency_ms`` (started on first use, stopped with the run)."""
        if latency_ms not in self._models:
            with phase(self.progress, f"start the fake model server ({latency_ms:g} ms)"):
                self._models[latency_ms] = self._model_exits.enter_context(fake_model(latency_ms))
        return self._models[latency_ms]

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
        self._model_exits.close()
        self._models.clear()


@dataclass(frozen=True)
class BenchRun:
    """What a scenario gets: the progress display, the mode and the shared stacks."""

    progress: Progress
    quick: bool
    stacks: Stacks
