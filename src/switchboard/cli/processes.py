"""The single-process commands: api, worker, beat, mcp and flower."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from switchboard.cli.common import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    ConfigOpt,
    HostOpt,
    PortOpt,
    _check_serving,
    _fail,
    _settings,
    _with_stack_redis,
    app,
)
from switchboard.shared.config import Settings

if TYPE_CHECKING:
    pass


def _check_layout(settings: Settings) -> None:
    """The store's slot groups agree with this process's (`wiring.check_layout`; imported
    here: the wiring loads the tool catalog, which `switchboard --help` need not)."""
    from switchboard.wiring import check_layout

    check_layout(settings)


def _celery_quiet(settings: Settings) -> list[str]:
    """Celery's startup banner is not a log line: shown only with logs at DEBUG on a
    terminal (`SWITCHBOARD_LOG_LEVEL=DEBUG`), never in JSON lines."""
    from switchboard.logs import resolve_format

    json_lines = resolve_format(settings.log_format, sys.stderr) == "json"
    return [] if settings.log_level.upper() == "DEBUG" and not json_lines else ["--quiet"]


@app.command()
def api(
    config: ConfigOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    reuse_port: Annotated[
        bool,
        typer.Option(
            "--reuse-port",
            help="Bind with SO_REUSEPORT, sharing the port with other api processes that do "
            "(`switchboard up --apis N` starts N so; the kernel spreads connections).",
        ),
    ] = False,
) -> None:
    """Run the HTTP api (FastAPI on uvicorn)."""
    settings = _settings(config)
    _check_serving(settings)  # before the imports: a refusal is one line, never a trace
    import uvicorn

    from switchboard.api.app import create_app
    from switchboard.api.auth import proxy_options
    from switchboard.logs import setup_logging
    from switchboard.shared.event_loops import uvicorn_loop
    from switchboard.supervisor.listener import bind_listener

    _check_layout(settings)
    setup_logging(settings.log_level)
    bind_host = host or settings.host
    bind_port = port if port is not None else settings.port
    application = create_app(settings, tune_gc=True, url=f"http://{bind_host}:{bind_port}")
    options: dict[str, Any] = {
        "log_level": settings.log_level.lower(),
        "log_config": None,  # uvicorn's records go through the product's handler (logs.py)
        "access_log": False,
        **proxy_options(settings),  # X-Forwarded-For only from SWITCHBOARD_TRUSTED_PROXIES
        **uvicorn_loop(),  # uvloop and httptools where installed
    }
    if not reuse_port:
        uvicorn.run(application, host=bind_host, port=bind_port, **options)
        return
    try:
        listener = bind_listener(bind_host, bind_port, reuse_port=True)
    except OSError as exc:
        _fail("cannot listen", f"{bind_host}:{bind_port}: {exc.strerror or exc}", EXIT_UNAVAILABLE)
    server = uvicorn.Server(uvicorn.Config(application, **options))
    server.run(sockets=[listener])
    if not server.started:
        raise typer.Exit(EXIT_UNAVAILABLE)


@app.command()
def worker(
    config: ConfigOpt = None,
    concurrency: Annotated[
        int,
        typer.Option(
            help="Messages one worker process handles at once (pool threads): flow steps, "
            "and runs being handed to the run loops. Runs in flight: --max-in-flight.",
            min=1,
            max=4096,
        ),
    ] = 128,
    max_in_flight: Annotated[
        int | None,
        typer.Option(
            "--max-in-flight",
            help="Runs one worker process keeps in flight on its event loops; at the limit "
            "it takes no more messages until runs end. [default: "
            "SWITCHBOARD_WORKER_MAX_IN_FLIGHT, else 10000]",
            min=1,
        ),
    ] = None,
    node: Annotated[
        str,
        typer.Option(
            "--node",
            "-n",
            help="The worker's node name (Celery's -n; %h is the host name). Give each "
            "worker on one host its own: two with the same name collide on RabbitMQ.",
        ),
    ] = "celery@%h",
) -> None:
    """Run a Celery worker executing agent runs (threads pool; runs as coroutines)."""
    settings = _settings(config)
    _check_serving(settings)  # before the imports: a refusal is one line, never a trace
    from switchboard.logs import setup_logging
    from switchboard.workers.app import ALL_QUEUES, create_celery_app

    _check_layout(settings)
    if max_in_flight is not None:
        settings = settings.model_copy(update={"worker_max_in_flight": max_in_flight})
    setup_logging(settings.log_level)
    celery_app = create_celery_app(settings)
    celery_app.worker_main(
        [
            *_celery_quiet(settings),
            "worker",
            f"--concurrency={concurrency}",
            f"--hostname={node}",
            f"--queues={','.join(ALL_QUEUES)}",
            f"--loglevel={settings.log_level}",
            "--without-gossip",
            "--without-mingle",
        ]
    )


@app.command()
def beat(config: ConfigOpt = None) -> None:
    """Run Celery beat: the periodic recovery sweep."""
    settings = _settings(config)
    _check_serving(settings)  # before the imports: a refusal is one line, never a trace
    from switchboard.logs import setup_logging
    from switchboard.workers.app import create_celery_app

    _check_layout(settings)
    setup_logging(settings.log_level)
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    celery_app = create_celery_app(settings)
    if settings.redis_url:  # the heartbeat `check-health --beat` reads
        from switchboard.cli.heartbeat import heartbeat_scheduler
        from switchboard.shared.store.client import connect_plain
        from switchboard.shared.store.keyspace import Keyspace
        from switchboard.shared.store.sweeps import SweepStore

        client = connect_plain(
            settings.redis_url,
            socket_timeout=3,
            socket_connect_timeout=3,
        )
        marks = SweepStore(client, Keyspace(settings.key_prefix, settings.groups))
        celery_app.conf.beat_scheduler = heartbeat_scheduler(marks, settings.sweep_interval_s)
    celery_app.start(
        [
            *_celery_quiet(settings),
            "beat",
            f"--loglevel={settings.log_level}",
            f"--schedule={data_dir / 'beat-schedule'}",
        ]
    )


@app.command("mcp")
def mcp_stdio(
    session_key: Annotated[
        str | None,
        typer.Option(
            "--session-key",
            help="The session the MCP client acts for: a key, `main`, or a sessionId "
            "(default: the default agent's main session).",
        ),
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Serve the session tools over MCP on stdin/stdout (talks to Redis directly)."""
    import anyio

    from switchboard.api.mcp import serve_stdio
    from switchboard.api.tools import tool_context
    from switchboard.logs import setup_logging
    from switchboard.shared.errors import StoreUnavailable
    from switchboard.wiring import build_services
    from switchboard.workers.app import create_celery_app
    from switchboard.workers.queue import CeleryQueue

    settings = _with_stack_redis(_settings(config))
    if not settings.redis_url:
        _fail(
            "no Redis", "start `switchboard up` here or set SWITCHBOARD_REDIS_URL", EXIT_UNAVAILABLE
        )
    setup_logging(settings.log_level)
    services = build_services(settings, queue=CeleryQueue(create_celery_app(settings)))
    try:
        tool_context(services, session_key)  # an unknown sessionId is an error before serving
        anyio.run(serve_stdio, services, session_key)
    except StoreUnavailable as exc:
        _fail("cannot reach Redis", str(exc.__cause__), EXIT_UNAVAILABLE)


@app.command()
def flower(
    config: ConfigOpt = None,
    address: Annotated[
        str | None, typer.Option(help="Bind address (default: SWITCHBOARD_HOST, 127.0.0.1).")
    ] = None,
    port: Annotated[int, typer.Option(help="Port.", min=1, max=65535)] = 5555,
    basic_auth: Annotated[
        str | None,
        typer.Option(
            "--basic-auth",
            envvar="SWITCHBOARD_FLOWER_BASIC_AUTH",
            show_envvar=True,
            help="user:password for HTTP basic auth (several pairs: comma-separated). "
            "Prefer the environment variable: a command line is visible to `ps`.",
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="Run without authentication (Flower can revoke tasks and stop workers: "
            "only on a trusted network; its HTTP API stays disabled).",
        ),
    ] = False,
    max_tasks: Annotated[
        int, typer.Option(help="Tasks Flower keeps in memory.", min=100, max=1_000_000)
    ] = 10_000,
    url_prefix: Annotated[
        str | None, typer.Option(help="Serve under this path (behind a reverse proxy).")
    ] = None,
) -> None:
    """Run Flower, Celery's monitoring UI, against the product's Celery app."""
    pairs = [pair.strip() for pair in (basic_auth or "").split(",") if pair.strip()]
    if no_auth and pairs:
        _fail("conflicting options", "--no-auth and --basic-auth (or its env var)", EXIT_USAGE)
    if not no_auth and not pairs:
        _fail(
            "refusing to start Flower without authentication",
            "set SWITCHBOARD_FLOWER_BASIC_AUTH=user:password (or pass --basic-auth), "
            "or pass --no-auth on a trusted network",
            EXIT_USAGE,
        )
    problem = _basic_auth_problem(pairs)
    if problem:
        # Exit 2 (usage) once: a supervisor that restarts on failure should not loop on it.
        _fail("refusing to start Flower", problem, EXIT_USAGE)

    from switchboard.logs import setup_logging
    from switchboard.workers.app import create_celery_app

    settings = _with_stack_redis(_settings(config))
    setup_logging(settings.log_level)
    celery_app = create_celery_app(settings)
    argv = [
        "flower",
        f"--address={address or settings.host}",
        f"--port={port}",
        f"--max_tasks={max_tasks}",
        # Autoscaled workers come and go: forget offline ones after a minute.
        "--purge_offline_workers=60",
    ]
    if not settings.task_events:  # off means off: Flower does not switch them on
        argv.append("--enable_events=False")
    if pairs:
        argv.append(f"--basic_auth={','.join(pairs)}")
    if url_prefix:
        argv.append(f"--url_prefix={url_prefix}")
    celery_app.start(argv)


def _basic_auth_problem(pairs: list[str]) -> str | None:
    """What is wrong with Flower's user:password pairs (never echoing a password), or None."""
    for number, pair in enumerate(pairs, start=1):
        user, colon, password = pair.partition(":")
        which = f"pair {number} of --basic-auth / SWITCHBOARD_FLOWER_BASIC_AUTH"
        if not colon:
            return f"{which} has no password (expected user:password)"
        if not user:
            return f"{which} has an empty user name (expected user:password)"
        if not password:
            return f"{which} (user {user!r}) has an empty password (expected user:password)"
    return None
