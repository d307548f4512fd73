"""Every command finds a running `switchboard up` with no settings; CLI errors and exit codes.

One `up` in a fresh directory is shared by the module; each command runs as a newcomer runs
it: in that directory, with no SWITCHBOARD_* variable and no --url.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import psutil
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from switchboard.shared.store.client import connect_plain
from switchboard.supervisor.redis_server import RedisServer
from switchboard.supervisor.runfile import RUNFILE, StackInfo, read_stack, write_stack
from switchboard_testkit.up import UpProcess, clean_env, free_port, start_up

pytestmark = pytest.mark.e2e

NOT_FOUND, USAGE, UNAVAILABLE = 1, 2, 3


# A second agent that only `up --config` knows of: a command that runs with the stack's
# config sees it, one that runs with the defaults does not.
STACK_CONFIG = {
    "agents": {
        "list": [
            {"id": "main", "default": True, "subagents": {"allowAgents": ["*"]}},
            {"id": "reviewer"},
        ]
    }
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    """`switchboard up` with the offline model, in a directory of its own."""
    with start_up(tmp_path_factory.mktemp("stack"), STACK_CONFIG, concurrency=4) as started:
        yield started


def cli(workdir: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """`switchboard ARGS` in workdir with no SWITCHBOARD_* setting."""
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args],
        cwd=workdir,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_runtime_file_is_private_and_names_the_stack(stack: UpProcess) -> None:
    """`up` writes .switchboard/stack.json (0600) with its pid, api URL and a live Redis URL
    (its password kept in redis.password, added by `read_stack`)."""
    path = stack.workdir / ".switchboard" / RUNFILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    info = json.loads(path.read_text())
    assert info["pid"] == stack.proc.pid
    assert info["api_url"] == stack.url
    assert info["broker_url"] == info["redis_url"]
    found = read_stack(stack.workdir / ".switchboard")  # the password put back from its file
    assert found is not None and found.redis_url != info["redis_url"]
    assert connect_plain(found.redis_url, socket_timeout=3).ping()
    token = stack.workdir / ".switchboard" / "token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stack.token not in path.read_text()  # the token stays in its own file


def test_send_and_sessions_find_the_stack_without_settings(stack: UpProcess) -> None:
    """`send` and `sessions` reach the running stack and say on stderr which one."""
    sent = cli(stack.workdir, "send", "main", "found you")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == "found you"
    assert f"pid {stack.proc.pid}" in sent.stderr and stack.url in sent.stderr
    listing = cli(stack.workdir, "sessions", "--wide")
    assert listing.returncode == 0, listing.stderr
    assert "agent:main:main" in listing.stdout


def test_check_health_finds_redis_and_api(stack: UpProcess) -> None:
    """`check-health --api` checks the stack's embedded Redis and its api with no settings."""
    health = cli(stack.workdir, "check-health", "--api")
    assert health.returncode == 0, health.stderr
    assert health.stdout.strip() == "healthy"
    assert health.stderr.count("using the stack") == 1


def test_check_health_all_ends_once_the_stacks_workers_answered(stack: UpProcess) -> None:
    """`check-health --all` beside `up` lists api, worker and beat, and its worker ping ends
    once the stack's one worker answered, well before the 3 s a ping to unknown workers takes."""
    started = time.monotonic()
    health = cli(stack.workdir, "check-health", "--all")
    took_s = time.monotonic() - started
    assert health.returncode == 0, health.stdout + health.stderr
    lines = health.stdout.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == ["api", "worker", "beat"], lines
    assert "celery@" in lines[1] and lines[-1] == "healthy"
    assert health.stderr.count("using the stack") == 1
    # Pointed at the same Redis by URL it cannot know how many workers to expect: its ping
    # waits out the full 3 s, so it takes longer by about that much.
    started = time.monotonic()
    found = read_stack(stack.workdir / ".switchboard")  # its URL with the password
    assert found is not None
    env = {**clean_env(), "SWITCHBOARD_REDIS_URL": found.redis_url}
    unknown = subprocess.run(
        [sys.executable, "-m", "switchboard", "check-health", "--all"],
        cwd=stack.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    unknown_s = time.monotonic() - started
    assert unknown.returncode == 0, unknown.stdout + unknown.stderr
    assert unknown_s >= 3.0 and took_s < unknown_s - 1.0, (took_s, unknown_s)


def test_mcp_stdio_lists_the_tools_without_settings(stack: UpProcess) -> None:
    """The MCP SDK's stdio client starts `switchboard mcp` beside `up` and lists the tools."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "switchboard", "mcp"],
        env=clean_env(),
        cwd=stack.workdir,
    )

    async def tools_and_agents() -> tuple[set[str], str]:
        with anyio.fail_after(30), (stack.workdir / "mcp-stderr.log").open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                names = {tool.name for tool in (await session.list_tools()).tools}
                agents = await session.call_tool("agents_list", {})
                return names, json.dumps(agents.model_dump(mode="json"))

    names, agents = anyio.run(tools_and_agents)
    assert {"sessions_list", "sessions_send", "sessions_spawn"} <= names
    # The stack's config, not the defaults: `up --config` named the second agent.
    assert "reviewer" in agents, agents
    said = (stack.workdir / "mcp-stderr.log").read_text()
    assert f"pid {stack.proc.pid}" in said and "using the stack" in said


def test_flower_finds_the_stacks_broker_without_settings(stack: UpProcess) -> None:
    """`switchboard flower` beside `up` (only its login set) says which stack it found and
    sees that stack's worker through the stack's broker."""
    port = free_port()
    auth = ("ops", "flower-pass")
    log = stack.workdir / "flower.log"
    with log.open("w") as out:
        flower = subprocess.Popen(
            [sys.executable, "-m", "switchboard", "flower", "--port", str(port)],
            cwd=stack.workdir,
            env={**clean_env(), "SWITCHBOARD_FLOWER_BASIC_AUTH": ":".join(auth)},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        workers: dict[str, object] = {}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", auth=auth, timeout=10) as http:
            while not workers:
                assert flower.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
                with contextlib.suppress(httpx.HTTPError):
                    resp = http.get("/api/workers", params={"refresh": "1"})
                    workers = resp.json() if resp.status_code == 200 else {}
        assert any(name.startswith("celery@") for name in workers), workers
        assert f"pid {stack.proc.pid}" in log.read_text()
    finally:
        if flower.poll() is None:
            os.killpg(flower.pid, signal.SIGTERM)
        try:
            flower.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(flower.pid, signal.SIGKILL)
            flower.wait(timeout=10)


def test_a_second_up_is_refused_fast_naming_the_pid(stack: UpProcess) -> None:
    """`up` on a data dir whose stack is alive exits 1 in under 5 s with its pid and URL."""
    second = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "up", "--port", str(free_port())],
        cwd=stack.workdir,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = second.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        _kill_tree(second.pid)  # it started a stack of its own: leave no orphans
        raise AssertionError("a second `up` was not refused within 5 s") from None
    assert second.returncode == NOT_FOUND, stderr
    assert f"pid {stack.proc.pid}" in stderr
    assert stack.url in stderr
    assert stack.proc.poll() is None


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant (each child runs in a session of its own)."""
    parent = psutil.Process(pid)
    for proc in [*parent.children(recursive=True), parent]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def test_history_of_an_unknown_key_exits_1(stack: UpProcess) -> None:
    """`history` of a key no session has is `not found`: exit 1 naming the key."""
    missing = cli(stack.workdir, "history", "agent:main:nobody-here")
    assert missing.returncode == NOT_FOUND, missing.stderr
    assert "no session agent:main:nobody-here" in missing.stderr


def test_square_brackets_survive_in_error_messages(stack: UpProcess) -> None:
    """Text in square brackets in a refusal or a run's error prints whole, not as markup."""
    refused = cli(stack.workdir, "spawn", "x", "--model", "[red]x/y")
    assert refused.returncode == NOT_FOUND, refused.stderr
    assert "[red]x/y" in refused.stderr
    failed = cli(stack.workdir, "send", "main", "/fail [boom] broke")
    assert failed.returncode == NOT_FOUND, failed.stderr
    assert "[boom] broke" in failed.stderr


def test_an_unreachable_api_exits_3(stack: UpProcess) -> None:
    """A client command whose api does not answer exits 3 (unavailable)."""
    down = cli(stack.workdir, "sessions", "--url", f"http://127.0.0.1:{free_port()}")
    assert down.returncode == UNAVAILABLE, down.stderr
    assert "cannot reach the api" in down.stderr


def test_a_store_that_is_down_exits_3(tmp_path: Path) -> None:
    """Redis down: the client commands (the api answers 503), `mcp` and `check-health` all
    exit 3 (unavailable) with one line, never 0 or 1."""
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.data_dir.mkdir(parents=True)
    redis_server.start()
    port = free_port()
    env = {
        **clean_env(),
        "SWITCHBOARD_REDIS_URL": redis_server.url,
        "SWITCHBOARD_TOKEN": "down-test-token",
        "SWITCHBOARD_PORT": str(port),
    }
    api = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "api"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            assert api.poll() is None and time.monotonic() < deadline, "api never healthy"
            time.sleep(0.2)
        redis_server.stop()
        commands = [
            ("sessions",),
            ("history", "main"),
            ("send", "main", "hi"),
            ("spawn", "a task"),
            ("mcp",),
        ]
        for args in [*commands, ("check-health",), ("check-health", "--api")]:
            done = subprocess.run(
                [sys.executable, "-m", "switchboard", *args],
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == UNAVAILABLE, (args, done.returncode, done.stderr)
            assert "Traceback" not in done.stderr, done.stderr
    finally:
        api.terminate()
        api.wait(timeout=30)
        redis_server.stop()


def _up_refused(workdir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`switchboard up` in workdir with the given settings, expected to give up by itself."""
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "up", "--port", str(free_port())],
        cwd=workdir,
        env={**clean_env(), **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
    )


@pytest.mark.parametrize(
    ("setting", "url", "shown"),
    [
        ("SWITCHBOARD_REDIS_URL", "redis://:pw@127.0.0.1:{port}/0", "Redis at redis://:***@"),
        ("SWITCHBOARD_BROKER_URL", "amqp://guest:pw@127.0.0.1:{port}//", "the broker at amqp"),
    ],
)
def test_up_refuses_a_store_or_broker_that_does_not_answer(
    tmp_path: Path, setting: str, url: str, shown: str
) -> None:
    """`up` with a Redis or broker URL that answers nothing exits 3 in one line naming the
    URL (password masked), what was tried and how long, before it says it is ready."""
    done = _up_refused(tmp_path, **{setting: url.format(port=free_port())})
    assert done.returncode == UNAVAILABLE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("unreachable: cannot reach ") and shown in lines[0]
    assert f"({setting})" in lines[0] and "refused" in lines[0] and "tried for 10 s" in lines[0]
    assert "pw" not in done.stderr and "Ctrl-C" not in done.stdout


def test_up_refuses_an_invalid_config_value(tmp_path: Path) -> None:
    """An invalid config value stops `up` with exit 2 and one line naming key, value and
    the choices; nothing is started."""
    config = tmp_path / "switchboard.json5"
    config.write_text('{tools: {sessions: {visibility: "everyone"}}}')
    done = _up_refused(tmp_path, SWITCHBOARD_CONFIG=str(config))
    assert done.returncode == USAGE, done.stderr
    assert done.stderr.strip() == (
        'error: invalid config: tools.sessions.visibility = "everyone": '
        "input should be 'self', 'tree', 'agent' or 'all'"
    )
    assert not (tmp_path / ".switchboard" / "redis").exists()


# `switchboard ARGS` with the OpenTelemetry SDK missing, as without the `otel` extra.
WITHOUT_OTEL_SDK = (
    "import sys; sys.modules['opentelemetry.sdk'] = None; "
    "from switchboard.cli import main; sys.argv = ['switchboard', *sys.argv[1:]]; main()"
)


@pytest.mark.parametrize("command", ["up", "api", "worker", "beat"])
def test_tracing_without_its_packages_is_refused_in_one_line(tmp_path: Path, command: str) -> None:
    """An OTLP endpoint set where the `otel` extra is not installed: exit 2, one line naming
    the variable and the extra, nothing started."""
    env = {
        **clean_env(),
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "SWITCHBOARD_REDIS_URL": "redis://127.0.0.1:1/0",  # never reached
    }
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL_SDK, command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == USAGE, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith("tracing: OTEL_EXPORTER_OTLP_ENDPOINT"), line
    assert "opentelemetry-sdk" in line and "install switchboard[otel]" in line


@pytest.mark.parametrize("command", ["api", "worker", "beat"])
def test_a_server_without_redis_is_refused_in_one_line(tmp_path: Path, command: str) -> None:
    """api, worker or beat with no Redis configured: exit 2 and one line saying what to set."""
    done = cli(tmp_path, command)
    assert done.returncode == USAGE, done.stderr
    assert done.stderr.strip() == (
        "no Redis: set SWITCHBOARD_REDIS_URL (or run `switchboard up`, which starts an "
        "embedded Redis)"
    )


def test_an_invalid_argument_exits_2(stack: UpProcess) -> None:
    """An api refusal of bad input (a malformed session key) is a usage error: exit 2."""
    bad = cli(stack.workdir, "send", "agent:main:[x]", "hi", "--url", stack.url)
    assert bad.returncode == USAGE, bad.stderr
    assert "illegal characters" in bad.stderr


def test_send_reads_the_message_from_stdin(stack: UpProcess) -> None:
    """`send SESSION -` sends stdin: 500 KB goes through, past 1,000,000 characters exits 2."""
    big = "x" * 500_000
    sent = subprocess.run(
        [sys.executable, "-m", "switchboard", "send", "hook:stdin", "-"],
        cwd=stack.workdir,
        env=clean_env(),
        input=big,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == big  # the echo model answers the message it was sent
    too_long = subprocess.run(
        [sys.executable, "-m", "switchboard", "send", "hook:stdin", "-"],
        cwd=stack.workdir,
        env=clean_env(),
        input="y" * 2_000_000,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert too_long.returncode == USAGE
    assert "message too long" in too_long.stderr and "Traceback" not in too_long.stderr
    history = cli(stack.workdir, "history", "hook:stdin", "--json")
    assert history.returncode == 0, history.stderr
    assert "yyyy" not in history.stdout  # the refused message never reached the session


def test_a_timed_out_send_says_why(stack: UpProcess) -> None:
    """A send whose reply does not come in time exits 1 and prints a reason."""
    slow = cli(stack.workdir, "send", "agent:main:slow", "/sleep 3", "--timeout", "0.5")
    assert slow.returncode == NOT_FOUND
    assert "timeout" in slow.stderr and "no reply within 0.5 s" in slow.stderr


def test_json_listings_and_kinds(stack: UpProcess) -> None:
    """`--json` prints whole keys as JSON; `--kinds` (repeatable or comma list) filters."""
    for key, text in (("main", "hi main"), ("agent:main:discord:group:dev", "hi group")):
        sent = cli(stack.workdir, "send", key, text)
        assert sent.returncode == 0, sent.stderr
    groups = json.loads(cli(stack.workdir, "sessions", "--kinds", "group", "--json").stdout)
    assert [row["key"] for row in groups["sessions"]] == ["agent:main:discord:group:dev"]
    both = cli(stack.workdir, "sessions", "--kinds", "main,group", "--json")
    kinds = {row["kind"] for row in json.loads(both.stdout)["sessions"]}
    assert kinds == {"main", "group"}
    again = cli(stack.workdir, "sessions", "--kinds", "main", "--kinds", "group", "--json")
    assert json.loads(again.stdout)["count"] == json.loads(both.stdout)["count"]
    table = cli(stack.workdir, "sessions", "--kinds", "group", "--wide")
    assert "discord" in table.stdout.split("agent:main:discord:group:dev", 1)[1].splitlines()[0]
    # Into a pipe the table keeps whole keys, however long.
    long_key = "agent:main:hook:" + "a-very-long-hook-name-" * 5 + "end"
    assert cli(stack.workdir, "send", long_key, "hi", "--timeout", "0").returncode == 0
    assert long_key in cli(stack.workdir, "sessions").stdout
    # A session with no delivery route shows `-`, never a column of "unknown".
    everything = cli(stack.workdir, "sessions", "--wide")
    main_row = everything.stdout.split("agent:main:main", 1)[1].splitlines()[0]
    assert main_row.split("│")[2].strip() == "-", main_row
    assert "unknown" not in everything.stdout
    history = json.loads(cli(stack.workdir, "history", "main", "--json").stdout)
    assert history["sessionKey"] == "agent:main:main"
    assert any(m["role"] == "user" for m in history["messages"])


def test_a_stale_runtime_file_is_replaced(tmp_path: Path) -> None:
    """`up` over a file left by a killed stack (pid dead) starts and writes its own."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    data_dir = tmp_path / ".switchboard"
    data_dir.mkdir()
    write_stack(data_dir, StackInfo(dead.pid, "http://127.0.0.1:1", "redis://x:1", "redis://x:1"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "up", "--port", str(free_port())],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        # Its children running means its signal handlers are in place: SIGINT is a clean stop.
        while time.monotonic() < deadline and not _started_beat(proc.pid):
            assert proc.poll() is None
            time.sleep(0.1)
        info = json.loads((data_dir / RUNFILE).read_text())
        assert info["pid"] == proc.pid, info
        assert info["api_url"] != "http://127.0.0.1:1"
    finally:
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=40)
    assert proc.returncode == 0
    assert not (data_dir / RUNFILE).exists()  # removed on the clean stop


def _started_beat(pid: int) -> bool:
    """True once `up` (pid) has started its beat child. A child that exits while it is
    looked at (`up` runs short-lived ones too, such as `redis-server --version`) is not it."""
    for child in psutil.Process(pid).children():
        try:
            if "beat" in child.cmdline():
                return True
        except psutil.NoSuchProcess:
            continue
    return False
