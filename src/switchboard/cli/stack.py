"""The `up` command: Redis, api, worker and beat on this machine, supervised together."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from switchboard.cli.common import (
    EXIT_REFUSED,
    ConcurrencyOpt,
    ConfigOpt,
    HostOpt,
    PortOpt,
    _fail,
    _saved_token,
    _settings,
    app,
    console,
)
from switchboard.shared.config import Settings, get_config

if TYPE_CHECKING:
    from switchboard.supervisor.redis_server import RedisServer


@app.command()
def up(
    config: ConfigOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    concurrency: ConcurrencyOpt = 128,
) -> None:
    """Run everything on this machine: Redis (embedded unless configured), api, worker, beat."""
    from switchboard.supervisor.runfile import DataDirLock, StackRunning

    settings = _settings(config)
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = DataDirLock(data_dir)
    try:
        lock.acquire()  # before Redis starts: a second `up` is refused at once
    except StackRunning as exc:
        _fail("refused", f"{exc}; stop it first (Ctrl-C in its terminal)", EXIT_REFUSED)
    try:
        raise typer.Exit(_run_stack(settings, data_dir, host, port, concurrency))
    finally:
        lock.release()


def _run_stack(
    settings: Settings, data_dir: Path, host: str | None, port: int | None, concurrency: int
) -> int:
    """Start Redis (unless configured), api, worker and beat; supervise them until stopped."""
    from switchboard.supervisor.processes import ProcessGroup, run_until_interrupted
    from switchboard.supervisor.runfile import StackInfo, remove_stack, write_stack

    token = (
        settings.token
        or get_config(settings.config).gateway.auth.token
        or _saved_token(data_dir, create=True)
    )
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
    bind_host = host or settings.host
    bind_port = port if port is not None else settings.port
    me = [sys.executable, "-m", "switchboard"]
    group = ProcessGroup(redis_server=redis_server, console=console)
    group.add("api", [*me, "api", "--host", bind_host, "--port", str(bind_port)], env)
    group.add("worker", [*me, "worker", "--concurrency", str(concurrency)], env)
    group.add("beat", [*me, "beat"], env)
    stack = StackInfo(
        pid=os.getpid(),
        api_url=f"http://{_client_host(bind_host)}:{bind_port}",
        redis_url=redis_url,
        broker_url=settings.broker_url or redis_url,
    )
    runfile = write_stack(data_dir, stack)
    console.print(f"[bold green]Switchboard[/] api on http://{escape(bind_host)}:{bind_port}")
    console.print(f"[bold green]token[/] {escape(token)}")
    console.print(f"[bold]stack[/] described in {escape(str(runfile))} for the other commands")
    console.print("Ctrl-C stops everything.")
    try:
        return run_until_interrupted(group)
    finally:
        remove_stack(data_dir, stack.pid)


def _start_redis(settings: Settings, data_dir: Path) -> tuple[RedisServer | None, str]:
    """The configured Redis URL, else an embedded redis-server started on the data dir."""
    from switchboard.supervisor.redis_server import RedisServer

    if settings.redis_url:
        return None, settings.redis_url
    server = RedisServer(data_dir / "redis", appendonly=True)
    server.data_dir.mkdir(parents=True, exist_ok=True)
    server.start()
    where = escape(str(server.data_dir))
    console.print(f"[bold]redis[/] embedded at {escape(server.url)} (data in {where})")
    return server, server.url


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
