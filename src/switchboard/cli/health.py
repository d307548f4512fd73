"""The `check-health` command: Redis, api, worker and beat probes for container checks."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Annotated

import httpx
import typer
from rich.markup import escape

from switchboard.cli.common import (
    EXIT_UNAVAILABLE,
    ConfigOpt,
    UrlOpt,
    _api_base,
    _settings,
    _with_stack_redis,
    app,
    console,
    err,
)
from switchboard.shared.config import Settings

if TYPE_CHECKING:
    pass


# `check-health --beat`: the sweep mark may be this many sweep intervals old (a beat that
# lost a tick or two is alive; one that stopped scheduling is not).
BEAT_STALE_INTERVALS = 6


@app.command("check-health")
def check_health(
    config: ConfigOpt = None,
    url: UrlOpt = None,
    api_check: Annotated[
        bool, typer.Option("--api", help="Also check the api's /healthz.")
    ] = False,
    worker_check: Annotated[
        bool,
        typer.Option(
            "--worker", help="Also ping this host's Celery worker (celery@$HOSTNAME, or --node)."
        ),
    ] = False,
    node: Annotated[
        str | None, typer.Option("--node", help="The worker node --worker pings.")
    ] = None,
    beat_check: Annotated[
        bool,
        typer.Option(
            "--beat",
            help=f"Also check the sweep beat schedules ran within {BEAT_STALE_INTERVALS} "
            "sweep intervals.",
        ),
    ] = False,
) -> None:
    """Exit 0 when Redis (and the api, this worker or the beat, as asked) answer; 3 otherwise.

    One check per role: the api's container runs `--api`, a worker's `--worker`, the
    beat's `--beat`; with none of them only Redis is checked."""
    configured = _settings(config)
    settings = _with_stack_redis(configured)
    problems = _redis_problems(settings, need_redis=not api_check or worker_check or beat_check)
    if api_check:
        # The stack's Redis was announced: its api is the same stack's, without a second line.
        quiet = settings.redis_url != configured.redis_url
        problems += _api_problems(_api_base(settings, url, quiet=quiet))
    if worker_check and not problems:
        problems += _worker_problems(settings, node or f"celery@{socket.gethostname()}")
    if beat_check and not problems:
        problems += _beat_problems(settings)
    for problem in problems:
        err.print(f"[red]unhealthy[/] {escape(problem)}")
    if problems:
        raise typer.Exit(EXIT_UNAVAILABLE)
    console.print("healthy")


def _redis_problems(settings: Settings, *, need_redis: bool) -> list[str]:
    """Whether the settings' Redis answers a ping (required unless only the api is checked)."""
    from switchboard.shared.errors import StoreUnavailable
    from switchboard.shared.store.client import connect_plain

    if not settings.redis_url:
        if need_redis:
            return ["redis: SWITCHBOARD_REDIS_URL is not set and no `up` runs here"]
        return []
    try:
        connect_plain(settings.redis_url, socket_timeout=3).ping()
    except StoreUnavailable as exc:
        return [f"redis: {exc.__cause__}"]
    return []


def _api_problems(base: str) -> list[str]:
    """Whether the api at ``base`` answers /healthz (which pings Redis itself)."""
    try:
        httpx.get(f"{base}/healthz", timeout=3).raise_for_status()
    except httpx.HTTPError as exc:
        return [f"api: {exc}"]
    return []


def _worker_problems(settings: Settings, node: str) -> list[str]:
    """Whether the Celery worker ``node`` answers a ping through the broker."""
    from switchboard.workers.app import create_celery_app

    celery_app = create_celery_app(settings)
    try:
        replies = celery_app.control.ping(destination=[node], timeout=3.0)
    except Exception as exc:  # kombu's connection errors vary by transport
        return [f"worker {node}: broker unreachable: {exc}"]
    finally:
        celery_app.close()
    if not any(node in reply for reply in replies):
        return [f"worker {node}: no reply to a ping within 3 s"]
    return []


def _beat_problems(settings: Settings) -> list[str]:
    """Whether the beat's sweep ran recently (the sweep marks when it ran, in the store)."""
    from switchboard.shared.store.client import connect_plain
    from switchboard.shared.store.keyspace import Keyspace
    from switchboard.shared.store.runs import now_ms
    from switchboard.shared.store.sweeps import SweepStore

    assert settings.redis_url  # _redis_problems reported its absence
    sweeps = SweepStore(
        connect_plain(settings.redis_url, socket_timeout=3), Keyspace(settings.key_prefix)
    )
    ran_at_ms = sweeps.last_ran("sweep")
    limit_s = BEAT_STALE_INTERVALS * settings.sweep_interval_s
    if ran_at_ms is None:
        return ["beat: the sweep has never run"]
    age_s = (now_ms() - ran_at_ms) / 1000
    if age_s > limit_s:
        return [f"beat: the sweep last ran {age_s:.0f}s ago (limit {limit_s:.0f}s)"]
    return []
