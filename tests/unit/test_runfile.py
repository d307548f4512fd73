"""The runtime file of `switchboard up` and its claim on a data directory."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from switchboard.supervisor.runfile import (
    REDIS_PASSWORD_FILE,
    RUNFILE,
    DataDirLock,
    StackInfo,
    StackRunning,
    read_stack,
    redis_password,
    remove_stack,
    with_password,
    without_password,
    write_stack,
)

pytestmark = pytest.mark.unit


def a_stack(pid: int) -> StackInfo:
    """A stack description with fixed URLs."""
    return StackInfo(pid, "http://127.0.0.1:8781", "redis://127.0.0.1:6390/0", "redis://b:1/0")


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_written_file_is_private_and_reads_back(tmp_path: Path) -> None:
    """The file is mode 0600 and a live pid's stack reads back field for field."""
    path = write_stack(tmp_path, a_stack(os.getpid()))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_stack(tmp_path) == a_stack(os.getpid())


def test_a_dead_pid_or_a_torn_file_is_no_stack(tmp_path: Path) -> None:
    """A file left by a killed stack, or not JSON, is ignored by readers."""
    write_stack(tmp_path, a_stack(dead_pid()))
    assert read_stack(tmp_path) is None
    (tmp_path / RUNFILE).write_text("{not json")
    assert read_stack(tmp_path) is None


def test_a_second_claim_is_refused_naming_the_pid_and_url(tmp_path: Path) -> None:
    """While one `up` holds the data dir, another claim raises with its pid and api URL."""
    first = DataDirLock(tmp_path)
    first.acquire()
    write_stack(tmp_path, a_stack(os.getpid()))
    with pytest.raises(StackRunning) as refused:
        DataDirLock(tmp_path).acquire()
    assert f"pid {os.getpid()}" in str(refused.value)
    assert "http://127.0.0.1:8781" in str(refused.value)
    first.release()
    DataDirLock(tmp_path).acquire()  # free again once released


def test_a_claim_replaces_a_stale_file(tmp_path: Path) -> None:
    """A runtime file without a lock holder (the stack was killed) is removed by the claim."""
    write_stack(tmp_path, a_stack(os.getpid()))  # even with a live (reused) pid
    lock = DataDirLock(tmp_path)
    lock.acquire()
    assert not (tmp_path / RUNFILE).exists()
    lock.release()


def test_remove_only_takes_the_own_file(tmp_path: Path) -> None:
    """A clean stop removes the file it wrote, never another stack's."""
    write_stack(tmp_path, a_stack(os.getpid()))
    remove_stack(tmp_path, os.getpid() + 1)
    assert (tmp_path / RUNFILE).exists()
    remove_stack(tmp_path, os.getpid())
    assert not (tmp_path / RUNFILE).exists()


def test_the_redis_password_is_kept_apart_and_put_back_on_read(tmp_path: Path) -> None:
    """stack.json holds the embedded Redis's URLs without the password; read_stack adds
    the one in redis.password (mode 0600, made once, the same on every later call)."""
    password = redis_password(tmp_path, create=True)
    assert password and redis_password(tmp_path, create=False) == password
    assert stat.S_IMODE((tmp_path / REDIS_PASSWORD_FILE).stat().st_mode) == 0o600
    url = with_password("redis://127.0.0.1:6390/0", password)
    assert url == f"redis://:{password}@127.0.0.1:6390/0"
    stack = StackInfo(os.getpid(), "http://127.0.0.1:8781", url, url, redis_auth=True)
    path = write_stack(tmp_path, stack)
    assert password not in path.read_text()
    assert password not in stack.describe()
    found = read_stack(tmp_path)
    assert found is not None and (found.redis_url, found.broker_url) == (url, url)
    assert without_password("redis://user:pw@h:1/0") == "redis://user@h:1/0"
    assert redis_password(tmp_path / "nowhere", create=False) is None
