"""The CLI's shared pieces: the typer app, consoles, option types, exit codes, settings."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from switchboard.shared.config import (
    ConfigError,
    Settings,
    cluster_url,
    get_config,
    get_settings,
    reset_caches,
)
from switchboard.shared.errors import InvalidInput, SwitchboardError, Unavailable

if TYPE_CHECKING:
    from switchboard.supervisor.runfile import StackInfo


app = typer.Typer(
    help="Session tools for AI agents on Celery + Redis.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# soft_wrap: replies and keys print unbroken (a pipe gets the text as is, not re-wrapped at 80).
console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="JSON5 config file (default: $SWITCHBOARD_CONFIG)."),
]
HostOpt = Annotated[str | None, typer.Option(help="Bind address (default 127.0.0.1).")]
PortOpt = Annotated[int | None, typer.Option(help="Port (default 8780).")]
ConcurrencyOpt = Annotated[
    int,
    typer.Option(
        help="Messages each worker process handles at once (pool threads): flow steps, and "
        "runs being handed to the run loops. Runs in flight: SWITCHBOARD_WORKER_MAX_IN_FLIGHT.",
        min=1,
        max=4096,
    ),
]
UrlOpt = Annotated[str | None, typer.Option("--url", help="Api base URL (default from settings).")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Bearer token.")]

TOKEN_FILE = "token"
# Exit codes, the same for every command (README: "The switchboard command").
EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


def _fail(label: str, detail: str, code: int) -> NoReturn:
    """Print one red line on stderr (the detail verbatim, brackets and all) and exit."""
    err.print(f"[red]{escape(label)}:[/] {escape(detail)}")
    raise typer.Exit(code)


def _exit_code(exc: SwitchboardError) -> int:
    """The exit code of a domain error: usage, unavailable, else not found / refused."""
    if isinstance(exc, InvalidInput):
        return EXIT_USAGE
    if isinstance(exc, Unavailable):
        return EXIT_UNAVAILABLE
    return EXIT_REFUSED


def _running_stack(settings: Settings) -> StackInfo | None:
    """The live stack `up` described in the data directory, if any."""
    from switchboard.supervisor.runfile import read_stack

    return read_stack(settings.data_dir.resolve())


def _announce(stack: StackInfo, settings: Settings) -> None:
    """Say on stderr which stack a command found (stdout stays the command's output)."""
    where = escape(str(settings.data_dir.resolve()))
    err.print(f"[dim]switchboard: using the stack in {where} ({escape(stack.describe())})[/]")


def _with_stack_redis(settings: Settings) -> Settings:
    """Settings whose Redis is the running `up`'s, unless SWITCHBOARD_REDIS_URL says otherwise."""
    if settings.redis_url:
        return settings
    stack = _running_stack(settings)
    if stack is None:
        return settings
    _announce(stack, settings)
    update: dict[str, object] = {
        "redis_url": stack.redis_url,
        "broker_url": settings.broker_url or stack.broker_url,
    }
    # The stack's agents and tool rules, and its keys, unless this command was told others.
    if settings.config is None and stack.config:
        update["config"] = Path(stack.config)
    if "key_prefix" not in settings.model_fields_set:
        update["key_prefix"] = stack.key_prefix
    return settings.model_copy(update=update)


def _api_base(settings: Settings, url: str | None, *, quiet: bool = False) -> str:
    """--url, else SWITCHBOARD_HOST/PORT when set, else the running `up`'s api, else default."""
    if url:
        return url.rstrip("/")
    if not {"host", "port"} & settings.model_fields_set:
        stack = _running_stack(settings)
        if stack is not None:
            if not quiet:
                _announce(stack, settings)
            return stack.api_url
    return f"http://{settings.host}:{settings.port}"


def _settings(config: Path | None) -> Settings:
    """Settings, with --config applied the same way SWITCHBOARD_CONFIG is."""
    if config is not None:
        os.environ["SWITCHBOARD_CONFIG"] = str(config)
        reset_caches()
    settings = get_settings()
    _check_redis_urls(settings)
    get_config(settings.config)  # validate early: a bad config is a clear error, not a trace
    return settings


def _check_serving(settings: Settings, *, need_redis: bool = True) -> None:
    """What a server process (up, api, worker, beat) cannot start without, refused in one
    line before it starts: a Redis URL (``need_redis``; `up` starts its own), and the
    tracing packages when tracing is asked for."""
    from switchboard import telemetry

    if need_redis and not settings.redis_url:
        _fail(
            "no Redis",
            "set SWITCHBOARD_REDIS_URL (or run `switchboard up`, which starts an embedded Redis)",
            EXIT_USAGE,
        )
    if telemetry.enabled() and (missing := telemetry.missing_packages()):
        _fail(
            "tracing",
            f"{' or '.join(telemetry.ENDPOINT_VARS)} is set but {', '.join(missing)} "
            "is not installed: install switchboard[otel], or unset the variable",
            EXIT_USAGE,
        )


def _check_redis_urls(settings: Settings) -> None:
    """A Redis URL in a form the store cannot use is one clear line at start (exit 2), not
    a redis-py traceback from the first connection (`store.urls.parse_redis_url`)."""
    from switchboard.shared.store.urls import parse_redis_url

    if settings.redis_url:
        parse_redis_url(settings.redis_url)
        if cluster_url(settings.redis_url) and not settings.broker_url:
            raise ConfigError(
                "SWITCHBOARD_REDIS_URL is a Redis Cluster, which holds state only (kombu "
                "has no cluster transport): set SWITCHBOARD_BROKER_URL to redis://, "
                "redis+sentinel:// or amqp:// for Celery's queues (docs/scaling.md)",
                key_path="SWITCHBOARD_BROKER_URL",
            )
    if settings.broker_url and settings.broker_url.startswith(("redis", "unix")):
        parse_redis_url(settings.broker_url, "SWITCHBOARD_BROKER_URL")


def _saved_token(data_dir: Path, *, create: bool) -> str:
    path = data_dir / TOKEN_FILE
    if path.exists():
        return path.read_text().strip()
    if not create:
        return ""
    token = secrets.token_urlsafe(24)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token
