"""The runtime file of a running `switchboard up`: where its api, Redis and broker listen.

`up` holds an exclusive lock on `up.lock` in its data directory for as long as it runs
(the kernel drops it when the process dies, however it dies), then writes `stack.json`
(mode 0600) once its Redis is up, and removes it on a clean stop. Other commands started
in the same directory read the file to find the stack without any setting; a file whose
pid is dead was left by a killed stack and is ignored, and replaced by the next `up`.

The embedded Redis's password is kept in `redis.password` (mode 0600, made once per data
directory), never in `stack.json`: the file holds the Redis URLs without it and says
``redis_auth``; `read_stack` puts the password back, so a command that finds the stack
reaches its Redis.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

RUNFILE = "stack.json"
LOCKFILE = "up.lock"
REDIS_PASSWORD_FILE = "redis.password"


@dataclass(frozen=True)
class StackInfo:
    """What another command needs to reach a running `up`."""

    pid: int
    api_url: str
    redis_url: str
    broker_url: str
    # What the stack's processes run with, for commands that act on its store themselves
    # (`mcp`: the agents and tool rules of `up --config`; `check-health --worker`).
    config: str = ""
    key_prefix: str = "sb:"
    worker_nodes: tuple[str, ...] = ()
    # The Redis URLs need the password in `REDIS_PASSWORD_FILE` (the embedded Redis).
    redis_auth: bool = False

    def describe(self) -> str:
        """One line naming the stack: pid and URLs (no password)."""
        return f"pid {self.pid}, api {self.api_url}, redis {without_password(self.redis_url)}"


class StackRunning(Exception):
    """Another `up` holds this data directory."""

    def __init__(self, data_dir: Path, pid: int | None, stack: StackInfo | None) -> None:
        self.data_dir, self.pid, self.stack = data_dir, pid, stack
        where = stack.describe() if stack else f"pid {pid or '?'}, still starting"
        super().__init__(f"a stack is already running on {data_dir} ({where})")


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (ours or another user's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def read_stack(data_dir: Path) -> StackInfo | None:
    """The stack described in `data_dir`, or None: no file, unreadable, or its pid dead."""
    try:
        raw = json.loads((data_dir / RUNFILE).read_text())
        stack = StackInfo(
            pid=int(raw["pid"]),
            api_url=str(raw["api_url"]),
            redis_url=str(raw["redis_url"]),
            broker_url=str(raw["broker_url"]),
            config=str(raw.get("config") or ""),
            key_prefix=str(raw.get("key_prefix") or "sb:"),
            worker_nodes=tuple(str(node) for node in raw.get("worker_nodes") or ()),
            redis_auth=bool(raw.get("redis_auth")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not pid_alive(stack.pid):
        return None
    password = redis_password(data_dir, create=False) if stack.redis_auth else None
    if not password:
        return stack
    return replace(
        stack,
        redis_url=with_password(stack.redis_url, password),
        broker_url=with_password(stack.broker_url, password)
        if stack.broker_url == stack.redis_url
        else stack.broker_url,
    )


def write_stack(data_dir: Path, stack: StackInfo) -> Path:
    """Write the runtime file atomically, readable by its owner only (a configured URL as
    given, the embedded Redis's without its password)."""
    path = data_dir / RUNFILE
    tmp = path.with_name(f".{RUNFILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    record = asdict(stack)
    if stack.redis_auth:  # the embedded Redis's password stays in its own file
        record["redis_url"] = without_password(stack.redis_url)
        record["broker_url"] = without_password(stack.broker_url)
    with os.fdopen(fd, "w") as out:
        json.dump(record, out)
        out.write("\n")
    os.replace(tmp, path)
    return path


def redis_password(data_dir: Path, *, create: bool) -> str | None:
    """The embedded Redis's password in ``data_dir`` (made, mode 0600, when ``create`` and
    there is none yet); None when there is none."""
    path = data_dir / REDIS_PASSWORD_FILE
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        if not create:
            return None
    password = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(password + "\n")
    return password


def with_password(url: str, password: str) -> str:
    """``url`` carrying ``password`` (a URL that names a user or password is kept)."""
    parts = urlsplit(url)
    if not parts.scheme.startswith("redis") or "@" in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=f":{password}@{parts.netloc}"))


def without_password(url: str) -> str:
    """``url`` without the password it may carry (to show or to write down)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}@{host}" if name else host))


def remove_stack(data_dir: Path, pid: int) -> None:
    """Remove the runtime file if it is this pid's (a clean stop)."""
    path = data_dir / RUNFILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if int(json.loads(path.read_text())["pid"]) == pid:
            path.unlink()


class DataDirLock:
    """The exclusive claim of `up` on a data directory, held while the stack runs."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock at once or raise StackRunning naming the holder; drop a stale file."""
        fd = os.open(self.data_dir / LOCKFILE, os.O_RDWR | os.O_CREAT, 0o600)
        handle = os.fdopen(fd, "r+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = handle.read().strip()
            handle.close()
            pid = int(holder) if holder.isdigit() else None
            raise StackRunning(self.data_dir, pid, read_stack(self.data_dir)) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle
        # The lock was free: any runtime file here is a killed stack's; it is not ours.
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / RUNFILE).unlink()

    def release(self) -> None:
        """Release the lock (closing the file drops it)."""
        if self._file is not None:
            self._file.close()
            self._file = None
