"""The `up` command: Redis, api, worker and beat on this machine, supervised together."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from switchboard.cli.common import (
    EXIT_REFUSED,
    ConcurrencyOpt,
    ConfigOpt,
    HostOpt,
    PortOpt,
    _check_serving,
    _fail,
    _saved_token,
    _settings,
    app,
    console,
)
from switchboard.cli.reach import require_broker, require_redis
from switchboard.shared.config import Settings, get_config

if TYPE_CHECKING:
    from switchboard.supervisor.processes import ProcessGroup
    from switchboard.supervisor.redis_server import RedisServer

ApisOpt = Annotated[
    int,
    typer.Option(
        "--apis",
        help="Api processes, all serving the one port (SO_REUSEPORT: the kernel spreads "
        "connections over them).",
        min=1,
        max=64,
    ),
]
WorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        help="Worker processes (node names worker1@host, worker2@host, … when more than "
        "one), each with the --concurrency given.",
        min=1,
        max=64,
    ),
]


@app.command()
def up(
    config: ConfigOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    concurrency: ConcurrencyOpt = 128,
    apis: ApisOpt = 1,
    workers: WorkersOpt = 1,
) -> None:
    """Run everything on this machine: Redis (embedded unless configured), api, worker, beat."""
    from switchboard.supervisor.runfile import DataDirLock, StackRunning

    settings = _settings(config)
    _check_serving(settings, need_redis=False)
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = DataDirLock(data_dir)
    try:
        lock.acquire()  # before Redis starts: a second `up` is refused at once
    except StackRunning as exc:
        _fail("refused", f"{exc}; stop it first (Ctrl-C in its terminal)", EXIT_REFUSED)
    try:
        scale = _Scale(apis=apis, workers=workers, concurrency=concurrency)
        raise typer.Exit(_run_stack(settings, data_dir, host, port, scale))
    finally:
        lock.release()


@dataclass(frozen=True)
class _Scale:
    """How many api and worker processes `up` runs, and each worker's concurrency."""

    apis: int = 1
    workers: int = 1
    concurrency: int = 128


def _run_stack(
    settings: Settings, data_dir: Path, host: str | None, port: int | None, scale: _Scale
) -> int:
    """Start Redis (unless configured), api, worker and beat; supervise them until stopped."""
    from switchboard.shared.metrics import MULTIPROC_DIR_ENV
    from switchboard.supervisor.processes import ProcessGroup, run_until_interrupted
    from switchboard.supervisor.runfile import StackInfo, remove_stack, write_stack

    token = (
        settings.token
        or get_config(settings.config).gateway.auth.token
        or _saved_token(data_dir, create=True)
    )
    bind_host = host or settings.host
    bind_port = port if port is not None else settings.port
    if scale.apis > 1:
        _check_port(bind_host, bind_port)
    redis_server, redis_url = _start_redis(settings, data_dir)
    env = {
        "SWITCHBOARD_REDIS_URL": redis_url,
        "SWITCHBOARD_TOKEN": token,
        "SWITCHBOARD_DATA_DIR": str(data_dir),
        # The children write into pipes: `auto` is settled by up's own terminal.
        "SWITCHBOARD_LOG_FORMAT": _children_log_format(settings),
    }
    if settings.config:
        env["SWITCHBOARD_CONFIG"] = str(Path(settings.config).resolve())
    if MULTIPROC_DIR_ENV not in os.environ:
        env[MULTIPROC_DIR_ENV] = str(_metrics_dir(data_dir))
    group = ProcessGroup(redis_server=redis_server, console=console)
    _add_processes(group, env, scale, bind_host, bind_port)
    stack = StackInfo(
        pid=os.getpid(),
        api_url=f"http://{_client_host(bind_host)}:{bind_port}",
        redis_url=redis_url,
        broker_url=settings.broker_url or redis_url,
        config=env.get("SWITCHBOARD_CONFIG", ""),
        key_prefix=settings.key_prefix,
        redis_auth=redis_server is not None,  # the embedded one: its password is on file
        worker_nodes=tuple(
            node.replace("%h", socket.gethostname()) for node in _worker_nodes(scale.workers)
        ),
    )
    runfile = write_stack(data_dir, stack)
    served = f" ({scale.apis} processes)" if scale.apis > 1 else ""
    console.print(
        f"[bold green]Switchboard[/] api on http://{escape(bind_host)}:{bind_port}{served}"
    )
    if scale.workers > 1:
        console.print(f"[bold]workers[/] {scale.workers}, concurrency {scale.concurrency} each")
    console.print(f"[bold green]token[/] {escape(token)}")
    console.print(f"[bold]stack[/] described in {escape(str(runfile))} for the other commands")
    console.print("Ctrl-C stops everything.")
    try:
        return run_until_interrupted(group)
    finally:
        remove_stack(data_dir, stack.pid)


def _metrics_dir(data_dir: Path) -> Path:
    """Where the stack's processes keep their Prometheus counters (prometheus_client's
    multiprocess mode: a scrape of any api sums every process of the stack), emptied at
    each start as prometheus_client requires."""
    path = data_dir / "metrics"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path


def _check_port(host: str, port: int) -> None:
    """Refuse (exit 1) a port something listens on: the api processes bind it with
    SO_REUSEPORT, which would otherwise join another `up`'s group on it."""
    from switchboard.supervisor.listener import check_free

    if port == 0:
        _fail("refused", "--apis above 1 needs a fixed --port (not 0)", EXIT_REFUSED)
    try:
        check_free(host, port)
    except OSError as exc:
        _fail("cannot listen", f"{host}:{port}: {exc.strerror or exc}", EXIT_REFUSED)


def _add_processes(
    group: ProcessGroup,
    env: dict[str, str],
    scale: _Scale,
    host: str,
    port: int,
) -> None:
    """The api process(es), the worker(s) and beat; several of a kind are numbered.

    Several apis bind the one ``host:port`` with SO_REUSEPORT (the kernel spreads the
    connections). Several workers get distinct Celery node names (two workers with one
    name collide on RabbitMQ)."""
    me = [sys.executable, "-m", "switchboard"]
    serve = [*me, "api", "--host", host, "--port", str(port)]
    if scale.apis == 1:
        group.add("api", serve, env)
    else:
        for n in range(1, scale.apis + 1):
            group.add(f"api-{n}", [*serve, "--reuse-port"], env)
    work = [*me, "worker", "--concurrency", str(scale.concurrency)]
    if scale.workers == 1:
        group.add("worker", work, env)
    else:
        for n, node in enumerate(_worker_nodes(scale.workers), start=1):
            group.add(f"worker-{n}", [*work, "--node", node], env)
    group.add("beat", [*me, "beat"], env)


def _worker_nodes(count: int) -> list[str]:
    """The Celery node names of `up`'s workers (``%h``: this host): Celery's default for
    one, numbered for more."""
    if count == 1:
        return ["celery@%h"]
    return [f"worker{n}@%h" for n in range(1, count + 1)]


def _start_redis(settings: Settings, data_dir: Path) -> tuple[RedisServer | None, str]:
    """The configured Redis URL, else an embedded redis-server started on the data dir,
    with the data dir's password (its URL carries it to every process `up` starts)."""
    from switchboard.supervisor.redis_server import RedisServer
    from switchboard.supervisor.runfile import REDIS_PASSWORD_FILE, redis_password

    if settings.redis_url:
        require_redis(settings.redis_url, "SWITCHBOARD_REDIS_URL")
        _require_broker(settings.broker_url, settings.redis_url)
        return None, settings.redis_url
    _require_broker(settings.broker_url, "")
    password = redis_password(data_dir, create=True)
    server = RedisServer(data_dir / "redis", appendonly=True, password=password)
    server.data_dir.mkdir(parents=True, exist_ok=True)
    server.start()
    where = escape(str(server.data_dir))
    console.print(
        f"[bold]redis[/] embedded at {escape(server.address)} (data in {where}; its "
        f"password in {escape(str(data_dir / REDIS_PASSWORD_FILE))})"
    )
    return server, server.url


def _require_broker(broker_url: str | None, redis_url: str) -> None:
    """A configured broker other than the store's Redis must answer before anything starts."""
    if not broker_url or broker_url == redis_url:
        return
    if broker_url.startswith(("redis", "unix")):
        require_redis(broker_url, "SWITCHBOARD_BROKER_URL")
    else:
        require_broker(broker_url, "SWITCHBOARD_BROKER_URL")


def _client_host(bind_host: str) -> str:
    """The address a client on this machine dials for a bind address (any -> loopback)."""
    if bind_host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind_host == "::":
        return "[::1]"
    return f"[{bind_host}]" if ":" in bind_host else bind_host


def _children_log_format(settings: Settings) -> str:
    """How `up`'s processes render logs: console lines when up runs in a terminal."""
    from switchboard.logs import resolve_format

    return resolve_format(settings.log_format, sys.stdout)
