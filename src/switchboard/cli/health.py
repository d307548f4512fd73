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
    _running_stack,
    _settings,
    _with_stack_redis,
    app,
    console,
    err,
)
from switchboard.shared.config import Settings

if TYPE_CHECKING:
    pass


# `check-health --beat`: beat's heartbeat may be this many sweep intervals old (a beat that
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
            "--worker",
            help="Also ping this host's Celery worker (--node; else the workers of the "
            "`up` running here; else celery@$HOSTNAME).",
        ),
    ] = False,
    node: Annotated[
        str | None, typer.Option("--node", help="The worker node --worker pings.")
    ] = None,
    beat_check: Annotated[
        bool,
        typer.Option(
            "--beat",
            help=f"Also check the beat's heartbeat is at most {BEAT_STALE_INTERVALS} "
            "sweep intervals old.",
        ),
    ] = False,
    all_check: Annotated[
        bool,
        typer.Option(
            "--all",
            help="List every process this Redis and broker show (apis by their heartbeats, "
            "workers by a Celery ping to all, the beat by its heartbeat); unhealthy when "
            "any listed one is stale or a role has none alive.",
        ),
    ] = False,
) -> None:
    """Exit 0 when Redis (and the api, this worker or the beat, as asked) answer; 3 otherwise.

    One check per role: the api's container runs `--api`, a worker's `--worker`, the
    beat's `--beat`; with none of them only Redis is checked. `--all` checks the whole
    deployment from anywhere that reaches its Redis."""
    configured = _settings(config)
    settings = _with_stack_redis(configured)
    if all_check:
        problems = _redis_problems(settings, need_redis=True)
        if not problems:
            stack = None if configured.redis_url else _running_stack(configured)
            expected = len(stack.worker_nodes) if stack is not None else None
            problems = _report_all(settings, expected)
        for problem in problems:
            err.print(f"[red]unhealthy[/] {escape(problem)}")
        if problems:
            raise typer.Exit(EXIT_UNAVAILABLE)
        console.print("healthy")
        return
    problems = _redis_problems(settings, need_redis=not api_check or worker_check or beat_check)
    if api_check:
        # The stack's Redis was announced: its api is the same stack's, without a second line.
        quiet = settings.redis_url != configured.redis_url
        problems += _api_problems(_api_base(settings, url, quiet=quiet))
    if worker_check and not problems:
        for worker in [node] if node else _local_workers(configured):
            problems += _worker_problems(settings, worker)
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


def _local_workers(settings: Settings) -> list[str]:
    """The worker nodes of the `up` running on the data directory (all of them when it runs
    several), unless SWITCHBOARD_REDIS_URL points elsewhere; else this host's default node."""
    stack = None if settings.redis_url else _running_stack(settings)
    if stack is not None and stack.worker_nodes:
        return list(stack.worker_nodes)
    return [f"celery@{socket.gethostname()}"]


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
    """Whether the beat ticked lately: its scheduler writes a heartbeat into the store as it
    ticks (`cli.heartbeat`), whether or not a worker runs the sweeps it sends."""
    from switchboard.cli.heartbeat import HEARTBEAT
    from switchboard.shared.store.client import connect_plain
    from switchboard.shared.store.keyspace import Keyspace
    from switchboard.shared.store.runs import now_ms
    from switchboard.shared.store.sweeps import SweepStore

    assert settings.redis_url  # _redis_problems reported its absence
    marks = SweepStore(
        connect_plain(settings.redis_url, socket_timeout=3),
        Keyspace(settings.key_prefix, settings.groups),
    )
    beat_at_ms = marks.last_ran(HEARTBEAT)
    limit_s = BEAT_STALE_INTERVALS * settings.sweep_interval_s
    if beat_at_ms is None:
        return ["beat: no heartbeat yet (is `switchboard beat` running on this Redis?)"]
    age_s = (now_ms() - beat_at_ms) / 1000
    if age_s > limit_s:
        return [f"beat: its last heartbeat is {age_s:.0f}s old (limit {limit_s:.0f}s)"]
    return []


def _report_all(settings: Settings, expected_workers: int | None) -> list[str]:
    """Print one line per process seen (role, state, name, detail); the problems. With
    ``expected_workers`` (the `up` running here) the ping ends once they all answered."""
    from switchboard.shared.store.apis import API_HEARTBEAT_S, API_STALE_INTERVALS, ApiHeartbeats
    from switchboard.shared.store.client import connect_plain
    from switchboard.shared.store.keyspace import Keyspace
    from switchboard.shared.store.runs import now_ms

    assert settings.redis_url  # _redis_problems reported its absence
    problems: list[str] = []
    rows: list[tuple[str, str, str, str]] = []
    redis = connect_plain(settings.redis_url, socket_timeout=3)
    now = now_ms()
    limit_s = API_STALE_INTERVALS * API_HEARTBEAT_S
    apis = ApiHeartbeats(redis, Keyspace(settings.key_prefix, settings.groups)).all()
    for beat in apis:
        age_s = (now - beat.seen_ms) / 1000
        state = "ok" if age_s <= limit_s else "stale"
        rows.append(("api", state, beat.api_id, f"{beat.url} last heartbeat {age_s:.1f}s ago"))
        if state != "ok":
            problems.append(
                f"api {beat.api_id}: last heartbeat {age_s:.0f}s ago (limit {limit_s:.0f}s)"
            )
    if not apis:
        problems.append("api: no api heartbeat on this Redis")
    workers, worker_problem = _answering_workers(settings, expected_workers)
    rows += [("worker", "ok", node, "answered a ping") for node in workers]
    if worker_problem:
        problems.append(worker_problem)
    beat_problems = _beat_problems(settings)
    rows.append(
        (
            "beat",
            "ok" if not beat_problems else "stale",
            "beat",
            "; ".join(beat_problems) or "heartbeat fresh",
        )
    )
    problems += beat_problems
    for role, state, name, detail in rows:
        colour = "green" if state == "ok" else "red"
        console.print(f"{role:<7} [{colour}]{state:<6}[/] {escape(name)}  {escape(detail)}")
    return problems


def _answering_workers(settings: Settings, expected: int | None) -> tuple[list[str], str | None]:
    """The Celery nodes answering a ping broadcast within 3 s (or until ``expected`` have);
    the problem, if any. A spinner on stderr says what is awaited meanwhile."""
    from switchboard.workers.app import create_celery_app

    celery_app = create_celery_app(settings)
    try:
        with err.status("pinging every worker through the broker (up to 3 s)…"):
            replies = celery_app.control.ping(timeout=3.0, limit=expected)
    except Exception as exc:  # kombu's connection errors vary by transport
        return [], f"worker: broker unreachable: {exc}"
    finally:
        celery_app.close()
    nodes = sorted(node for reply in replies for node in reply)
    return nodes, None if nodes else "worker: no worker answered a ping within 3 s"
