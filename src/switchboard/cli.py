"""The `switchboard` command: runs the processes and talks to a running api.

Process commands (`up`, `api`, `worker`, `beat`, `flower`) read `--config` /
SWITCHBOARD_CONFIG and the SWITCHBOARD_* settings. Client commands (`send`, `sessions`,
`history`) call the api over HTTP with the bearer token (SWITCHBOARD_TOKEN, else the token
`up` saved in the data directory).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from switchboard.shared.config import Settings, get_config, get_settings, reset_caches
from switchboard.shared.errors import SwitchboardError

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
    int, typer.Option(help="Runs one worker process keeps in flight (threads).", min=1, max=4096)
]
UrlOpt = Annotated[str | None, typer.Option("--url", help="Api base URL (default from settings).")]
TokenOpt = Annotated[str | None, typer.Option("--token", help="Bearer token.")]

TOKEN_FILE = "token"


def _settings(config: Path | None) -> Settings:
    """Settings, with --config applied the same way SWITCHBOARD_CONFIG is."""
    if config is not None:
        os.environ["SWITCHBOARD_CONFIG"] = str(config)
        reset_caches()
    settings = get_settings()
    get_config(settings.config)  # validate early: a bad config is a clear error, not a trace
    return settings


@app.command()
def up(
    config: ConfigOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    concurrency: ConcurrencyOpt = 128,
) -> None:
    """Run everything on this machine: Redis (embedded unless configured), api, worker, beat."""
    from switchboard.supervisor.processes import ProcessGroup, run_until_interrupted
    from switchboard.supervisor.redis_server import RedisServer

    settings = _settings(config)
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    token = (
        settings.token
        or get_config(settings.config).gateway.auth.token
        or _saved_token(data_dir, create=True)
    )
    redis_server = None
    redis_url = settings.redis_url
    if not redis_url:
        redis_server = RedisServer(data_dir / "redis", appendonly=True)
        redis_server.data_dir.mkdir(parents=True, exist_ok=True)
        redis_server.start()
        redis_url = redis_server.url
        console.print(f"[bold]redis[/] embedded at {redis_url} (data in {redis_server.data_dir})")
    env = {
        "SWITCHBOARD_REDIS_URL": redis_url,
        "SWITCHBOARD_TOKEN": token,
        "SWITCHBOARD_DATA_DIR": str(data_dir),
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
    console.print(f"[bold green]Switchboard[/] api on http://{bind_host}:{bind_port}")
    console.print(f"[bold green]token[/] {token}")
    console.print("Ctrl-C stops everything.")
    raise typer.Exit(run_until_interrupted(group))


def _celery_quiet(settings: Settings) -> list[str]:
    """Celery's startup banner is not a log line: left out when logs are JSON lines."""
    return ["--quiet"] if settings.log_format == "json" else []


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


@app.command()
def api(config: ConfigOpt = None, host: HostOpt = None, port: PortOpt = None) -> None:
    """Run the HTTP api (FastAPI on uvicorn)."""
    import uvicorn

    from switchboard.api.app import create_app
    from switchboard.logs import setup_logging

    settings = _settings(config)
    setup_logging(settings.log_level)
    application = create_app(settings, tune_gc=True)
    uvicorn.run(
        application,
        host=host or settings.host,
        port=port if port is not None else settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,  # uvicorn's records go through the product's handler (logs.py)
        access_log=False,
    )


@app.command()
def worker(config: ConfigOpt = None, concurrency: ConcurrencyOpt = 128) -> None:
    """Run a Celery worker executing agent runs (threads pool)."""
    from switchboard.logs import setup_logging
    from switchboard.workers.app import ALL_QUEUES, create_celery_app

    settings = _settings(config)
    setup_logging(settings.log_level)
    celery_app = create_celery_app(settings)
    celery_app.worker_main(
        [
            *_celery_quiet(settings),
            "worker",
            f"--concurrency={concurrency}",
            f"--queues={','.join(ALL_QUEUES)}",
            f"--loglevel={settings.log_level}",
            "--without-gossip",
            "--without-mingle",
        ]
    )


@app.command()
def beat(config: ConfigOpt = None) -> None:
    """Run Celery beat: the periodic recovery sweep."""
    from switchboard.logs import setup_logging
    from switchboard.workers.app import create_celery_app

    settings = _settings(config)
    setup_logging(settings.log_level)
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    celery_app = create_celery_app(settings)
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
    import redis as redis_lib

    from switchboard.api.mcp import serve_stdio
    from switchboard.api.tools import tool_context
    from switchboard.logs import setup_logging
    from switchboard.wiring import build_services
    from switchboard.workers.app import create_celery_app
    from switchboard.workers.queue import CeleryQueue

    settings = _settings(config)
    setup_logging(settings.log_level)
    services = build_services(settings, queue=CeleryQueue(create_celery_app(settings)))
    try:
        tool_context(services, session_key)  # an unknown sessionId is an error before serving
        anyio.run(serve_stdio, services, session_key)
    except redis_lib.RedisError as exc:
        err.print(f"[red]cannot reach Redis:[/] {exc}")
        raise typer.Exit(2) from None


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
        err.print("[red]conflicting options:[/] --no-auth and --basic-auth (or its env var)")
        raise typer.Exit(2)
    if not no_auth and not pairs:
        err.print(
            "[red]refusing to start Flower without authentication:[/] set "
            "SWITCHBOARD_FLOWER_BASIC_AUTH=user:password (or pass --basic-auth), "
            "or pass --no-auth on a trusted network"
        )
        raise typer.Exit(2)
    bad = [p for p in pairs if not all(part for part in p.partition(":")[::2])]
    if bad:
        err.print("[red]invalid --basic-auth:[/] expected user:password (comma-separated pairs)")
        raise typer.Exit(2)

    from switchboard.logs import setup_logging
    from switchboard.workers.app import create_celery_app

    settings = _settings(config)
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
    if pairs:
        argv.append(f"--basic_auth={','.join(pairs)}")
    if url_prefix:
        argv.append(f"--url_prefix={url_prefix}")
    celery_app.start(argv)


@app.command("check-health")
def check_health(
    config: ConfigOpt = None,
    url: UrlOpt = None,
    api_check: Annotated[
        bool, typer.Option("--api", help="Also check the api's /healthz.")
    ] = False,
) -> None:
    """Exit 0 when Redis (and, with --api, the api) answer; 1 otherwise."""
    import redis as redis_lib

    settings = _settings(config)
    problems = []
    if settings.redis_url:
        try:
            redis_lib.Redis.from_url(settings.redis_url, socket_timeout=3).ping()
        except redis_lib.RedisError as exc:
            problems.append(f"redis: {exc}")
    elif not api_check:
        problems.append("redis: SWITCHBOARD_REDIS_URL is not set")
    if api_check:
        base = url or f"http://{settings.host}:{settings.port}"
        try:
            httpx.get(f"{base}/healthz", timeout=3).raise_for_status()
        except httpx.HTTPError as exc:
            problems.append(f"api: {exc}")
    for problem in problems:
        err.print(f"[red]unhealthy[/] {problem}")
    if problems:
        raise typer.Exit(1)
    console.print("healthy")


class _Client:
    """A small HTTP client for the api, with errors turned into readable messages."""

    def __init__(self, settings: Settings, url: str | None, token: str | None) -> None:
        self.base = (url or f"http://{settings.host}:{settings.port}").rstrip("/")
        tok = token or settings.token or _saved_token(settings.data_dir.resolve(), create=False)
        if not tok:
            err.print("[red]no token:[/] set SWITCHBOARD_TOKEN or pass --token")
            raise typer.Exit(2)
        self.http = httpx.Client(headers={"Authorization": f"Bearer {tok}"}, timeout=660)

    def rpc(self, method: str, params: dict[str, Any]) -> Any:
        return self._post("/rpc", {"method": method, "params": params})

    def invoke(self, tool: str, args: dict[str, Any], session_key: str) -> dict[str, Any]:
        body = self._post("/tools/invoke", {"tool": tool, "args": args, "sessionKey": session_key})
        result: dict[str, Any] = body["result"]
        return result

    def _post(self, path: str, payload: dict[str, Any]) -> Any:
        try:
            resp = self.http.post(f"{self.base}{path}", json=payload)
        except httpx.HTTPError as exc:
            err.print(f"[red]cannot reach the api at {self.base}:[/] {exc}")
            raise typer.Exit(2) from None
        body = resp.json()
        if resp.status_code != 200:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            if not isinstance(error, dict):
                error = {"message": str(error)}
            err.print(f"[red]{error.get('type', 'error')}:[/] {error.get('message', resp.text)}")
            raise typer.Exit(1)
        return body


@app.command()
def send(
    session: Annotated[str, typer.Argument(help="Session key, `main`, or a sessionId.")],
    message: Annotated[str, typer.Argument(help="The message.")],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the reply; 0 = don't.")] = 30,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Send a message into a session and print the reply."""
    client = _Client(_settings(config), url, token)
    started = client.rpc("agent", {"sessionKey": session, "message": message})
    run_id = started["runId"]
    if timeout <= 0:
        console.print(f"accepted run {run_id}")
        return
    outcome = client.rpc("agent.wait", {"runId": run_id, "timeoutMs": int(timeout * 1000)})
    if outcome["status"] == "ok":
        console.print(outcome.get("reply", ""), markup=False)
        return
    err.print(f"[yellow]{outcome['status']}[/] run {run_id}: {outcome.get('error', '')}")
    raise typer.Exit(1)


@app.command()
def spawn(
    task: Annotated[str, typer.Argument(help="What the sub-agent should do.")],
    session: Annotated[
        str, typer.Option("--session", help="The requester session (key, `main`, or sessionId).")
    ] = "main",
    agent: Annotated[str | None, typer.Option(help="Spawn under this agentId.")] = None,
    label: Annotated[str | None, typer.Option(help="A short name for the child session.")] = None,
    model: Annotated[str | None, typer.Option(help="Model override, provider/model.")] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the child's reply; 0 = don't.")
    ] = 0,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Spawn a sub-agent for a session; its result is announced back to that session."""
    client = _Client(_settings(config), url, token)
    args: dict[str, Any] = {"task": task}
    for name, value in (("agentId", agent), ("label", label), ("model", model)):
        if value is not None:
            args[name] = value
    result = client.invoke("sessions_spawn", args, session)
    if result.get("status") != "accepted":
        err.print(f"[red]{result.get('status', 'error')}:[/] {result.get('error', result)}")
        raise typer.Exit(1)
    console.print(f"spawned {result['childSessionKey']} (run {result['runId']})", markup=False)
    if timeout <= 0:
        return
    outcome = client.rpc("agent.wait", {"runId": result["runId"], "timeoutMs": int(timeout * 1000)})
    if outcome["status"] == "ok":
        console.print(outcome.get("reply", ""), markup=False)
        return
    err.print(f"[yellow]{outcome['status']}[/] run {result['runId']}: {outcome.get('error', '')}")
    raise typer.Exit(1)


@app.command()
def sessions(
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    active_minutes: Annotated[int | None, typer.Option(min=1)] = None,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List sessions, newest first."""
    client = _Client(_settings(config), url, token)
    params: dict[str, Any] = {"limit": limit}
    if active_minutes:
        params["activeMinutes"] = active_minutes
    listing = client.rpc("sessions.list", params)
    table = Table("key", "kind", "channel", "updated", "model", "tokens", "status")
    from datetime import UTC, datetime

    for row in listing["sessions"]:
        updated = datetime.fromtimestamp(row.get("updatedAt", 0) / 1000, UTC)
        table.add_row(
            row["key"],
            row.get("kind", ""),
            row.get("channel", ""),
            updated.strftime("%Y-%m-%d %H:%M:%S"),
            row.get("model", ""),
            str(row.get("totalTokens", "")),
            row.get("status", ""),
        )
    console.print(table)
    console.print(f"{listing['count']} session(s)")


@app.command()
def history(
    session: Annotated[str, typer.Argument(help="Session key, `main`, or a sessionId.")],
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a session's transcript."""
    client = _Client(_settings(config), url, token)
    result = client.rpc("chat.history", {"sessionKey": session, "limit": limit})
    for msg in result["messages"]:
        role = msg.get("role", "?")
        colour = {"user": "cyan", "assistant": "green", "toolResult": "yellow"}.get(role, "white")
        console.print(f"[bold {colour}]{role}[/]: ", end="")
        console.print(_message_text(msg), markup=False)


def _message_text(msg: dict[str, Any]) -> str:
    content = msg.get("content")
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") == "toolCall":
            parts.append(f"[tool call {block.get('name')} {block.get('arguments')}]")
        elif block.get("type") == "thinking":
            parts.append(f"[thinking] {block.get('thinking', '')}")
    return "\n".join(parts)


@app.command()
def bench(
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            "--scenario",
            "-s",
            help="Scenario to run, repeatable (default all): latency, throughput, listing, "
            "history, fanout, parked.",
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(help="Scaled-down counts, a smoke test that judges no speed (< 2 min)."),
    ] = False,
    out: Annotated[Path, typer.Option(help="Where the JSON figures go.")] = Path("bench/results"),
) -> None:
    """Benchmark the product against its anchors, side by side in one run."""
    from switchboard.bench import SCENARIOS, run_bench

    names = scenario or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        err.print(
            f"[red]unknown scenario(s):[/] {', '.join(unknown)}; known: {', '.join(SCENARIOS)}"
        )
        raise typer.Exit(2)
    raise typer.Exit(run_bench(names, quick=quick, out_dir=out, console=console))


def main() -> None:
    """Entry point: domain errors print as one clear line, never a stack trace."""
    try:
        app()
    except SwitchboardError as exc:
        err.print(f"[red]error:[/] {exc.message}")
        sys.exit(2)
