"""Supervising the children of `switchboard up`: start, prefix their output, stop them all.

Each child runs in its own process group, like the embedded Redis, so a Ctrl-C at the
terminal reaches only this supervisor, which then stops the children in order: SIGTERM to
each, a grace period, SIGKILL to whatever is left (the whole group, grandchildren too), and
the embedded Redis last, once nothing is using it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Self

from rich.console import Console
from rich.text import Text

from switchboard.supervisor.redis_server import RedisServer

STOP_TIMEOUT_S = 10.0
_POLL_INTERVAL_S = 0.1
_OUTPUT_DRAIN_S = 1.0
_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red")


@dataclass
class _Child:
    """One named command and, once started, its process and output pump."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None
    colour: str
    process: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ChildExit:
    """A child that exited while the group was still meant to be running."""

    name: str
    returncode: int

    def describe(self) -> str:
        """Say how it ended: an exit code or the signal that killed it."""
        if self.returncode < 0:
            return f"{self.name} was killed by {signal.Signals(-self.returncode).name}"
        return f"{self.name} exited with code {self.returncode}"


class ProcessGroup:
    """Named child processes that start together and stop together, then the embedded Redis."""

    def __init__(
        self,
        *,
        redis_server: RedisServer | None = None,
        console: Console | None = None,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        self.redis_server = redis_server
        self.console = console or Console(highlight=False)
        self.stop_timeout_s = stop_timeout_s
        self._children: dict[str, _Child] = {}
        # Set by a second Ctrl-C: skip the grace period and SIGKILL at once.
        self.kill_now = threading.Event()

    def add(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        """Register a command; `env` is laid over this process's environment."""
        if name in self._children:
            raise ValueError(f"a process named {name!r} is already in the group")
        colour = _COLOURS[len(self._children) % len(_COLOURS)]
        merged = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._children[name] = _Child(name, list(argv), merged, cwd, colour)

    @property
    def pids(self) -> dict[str, int]:
        """The pid of each started child, by name."""
        return {c.name: c.process.pid for c in self._children.values() if c.process}

    def start(self) -> None:
        """Start every registered child not yet started."""
        for child in self._children.values():
            if child.process is None:
                self._spawn(child)

    def first_exit(self) -> ChildExit | None:
        """Return the first started child found to have exited, if any."""
        for child in self._children.values():
            if child.process is not None and child.process.poll() is not None:
                return ChildExit(child.name, child.process.returncode)
        return None

    def stop(self) -> None:
        """Stop all children (SIGTERM, grace period, SIGKILL), then the embedded Redis."""
        running = [c.process for c in self._children.values() if c.process]
        for process in running:
            # Only the leader: it is in charge of shutting down its own pool processes.
            process.send_signal(signal.SIGTERM)  # a no-op once it has exited
        self._wait_for(running, self.stop_timeout_s)
        for child in self._children.values():
            _kill_group(child)  # stragglers and any grandchildren left in the group
            if child.pump is not None:
                child.pump.join(_OUTPUT_DRAIN_S)
        if self.redis_server is not None:
            self.redis_server.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def say(self, message: str, style: str = "bold") -> None:
        """Print a line of the supervisor's own, distinct from the children's output."""
        self.console.print(Text(f"switchboard: {message}", style=style))

    def _spawn(self, child: _Child) -> None:
        """Start one child in a new session and a thread that prefixes its output."""
        child.process = subprocess.Popen(
            child.argv,
            env=child.env,
            cwd=child.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert child.process.stdout is not None
        width = max(len(name) for name in self._children)
        prefix = Text(f"{child.name:<{width}} | ", style=child.colour)
        child.pump = threading.Thread(
            target=self._pump,
            args=(child.process.stdout, prefix),
            name=f"output-{child.name}",
            daemon=True,
        )
        child.pump.start()

    def _pump(self, stream: IO[bytes], prefix: Text) -> None:
        """Copy a child's output line by line, each behind its coloured name."""
        with stream:
            for raw in stream:
                line = raw.decode(errors="replace").rstrip("\r\n")
                self.console.print(prefix + Text(line), soft_wrap=True)

    def _wait_for(self, processes: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
        """Wait until the processes have exited, the timeout passes or `kill_now` is set."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.kill_now.is_set():
            if all(process.poll() is not None for process in processes):
                return
            time.sleep(_POLL_INTERVAL_S)


def _kill_group(child: _Child) -> None:
    """SIGKILL whatever is left of the child's process group and reap the child."""
    if child.process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is empty
        os.killpg(child.process.pid, signal.SIGKILL)
    child.process.wait()


def run_until_interrupted(group: ProcessGroup) -> int:
    """Start the group and supervise it until Ctrl-C, SIGTERM or a child's death; 0 if clean."""
    # The handler only counts: it runs on the main thread between two of its steps, and
    # an Event set there could wait on the lock the interrupted `Event.wait` holds (a
    # Ctrl-C that hung `up` about one time in twenty). The main thread polls the count.
    signals = 0

    def request_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            group.kill_now.set()  # nothing waits on it while holding its lock: polled

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        group.start()
        died: ChildExit | None = None
        while died is None and not signals:
            time.sleep(_POLL_INTERVAL_S)
            died = None if signals else group.first_exit()
        if died is not None:
            group.say(f"{died.describe()} unexpectedly; stopping everything", "bold red")
            return 1
        group.say("stopping (Ctrl-C again to kill at once)")
        return 0
    except OSError as exc:  # a command that cannot be started at all
        group.say(f"could not start a process: {exc}; stopping everything", "bold red")
        return 1
    finally:
        group.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
