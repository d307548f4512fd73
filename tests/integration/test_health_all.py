"""`switchboard check-health --all` on a real deployment in miniature: two apis, a worker
and a beat as subprocesses on a private Redis. Every one is listed; a killed api reads as
stale (exit 3) while the rest stay ok; an api stopped cleanly removes its own entry."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
import redis

from switchboard.shared.store.apis import (
    API_FORGET_MS,
    API_HEARTBEAT_S,
    API_STALE_INTERVALS,
    ApiBeat,
    ApiHeartbeats,
)
from switchboard.shared.store.keyspace import Keyspace
from switchboard_testkit.up import free_port

pytestmark = pytest.mark.integration

EXIT_UNAVAILABLE = 3


def check_all(procs: Any) -> subprocess.CompletedProcess[str]:
    """Run `switchboard check-health --all` with the processes' env."""
    return subprocess.run(
        [sys.executable, "-m", "switchboard", "check-health", "--all"],
        env={**procs.env, "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def rows(result: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str]]:
    """The listed processes: name -> (role, state)."""
    out = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in {"api", "worker", "beat"}:
            out[parts[2]] = (parts[0], parts[1])
    return out


def wait_for(procs: Any, done: object, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run the check until ``done(result)`` holds; fail with the last output after timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check_all(procs)
        if done(result):  # type: ignore[operator]
            return result
        for proc in procs.started:
            if proc.returncode is None and proc.poll() is not None:
                logs = "\n".join(p.read_text()[-2000:] for p in procs.log_dir.glob("*.log"))
                pytest.fail(f"a process exited ({proc.args}):\n{logs}")
        assert time.monotonic() < deadline, result.stdout + result.stderr
        time.sleep(0.5)


def test_check_health_all_lists_every_process_and_a_dead_api_as_stale(
    switchboard_procs: Any,
) -> None:
    procs = switchboard_procs
    host = socket.gethostname()
    ports = [free_port(), free_port()]
    apis = [procs("api", "--host", "127.0.0.1", "--port", str(port)) for port in ports]
    procs("worker", "--concurrency", "2")
    procs("beat")
    ids = [f"{host}:{api.pid}" for api in apis]

    healthy = wait_for(
        procs, lambda r: r.returncode == 0 and set(ids) <= set(rows(r)), timeout_s=90
    )
    listed = rows(healthy)
    assert listed[ids[0]] == ("api", "ok") and listed[ids[1]] == ("api", "ok"), healthy.stdout
    for port in ports:
        assert f"http://127.0.0.1:{port}" in healthy.stdout
    assert [n for n, (role, _) in listed.items() if role == "worker"] == [f"celery@{host}"]
    assert listed["beat"] == ("beat", "ok")
    assert healthy.stdout.strip().endswith("healthy")

    # kill -9 one api: it cannot remove its entry, which goes stale.
    apis[0].send_signal(signal.SIGKILL)
    apis[0].wait(10)
    killed_at = time.monotonic()
    # When a check last started that still listed it as ok: the entry must be stale for
    # every check started after its heartbeats' interval ran out. A check's own run time
    # (a Python start, seconds on a loaded machine) does not count against that.
    listed_ok_at = killed_at
    while True:
        started = time.monotonic()
        stale = check_all(procs)
        if rows(stale).get(ids[0]) == ("api", "stale"):
            break
        listed_ok_at = started
        assert started - killed_at < 30, stale.stdout + stale.stderr
        time.sleep(0.5)
    assert listed_ok_at - killed_at < API_STALE_INTERVALS * API_HEARTBEAT_S + 1
    assert stale.returncode == EXIT_UNAVAILABLE
    assert rows(stale)[ids[1]] == ("api", "ok")
    assert f"api {ids[0]}: last heartbeat" in stale.stderr

    # SIGTERM the other: it stops cleanly and removes its own entry (absent, not stale).
    apis[1].send_signal(signal.SIGTERM)
    apis[1].wait(30)
    gone = check_all(procs)
    assert ids[1] not in rows(gone), gone.stdout
    assert rows(gone)[ids[0]] == ("api", "stale")


def test_api_heartbeats_store_renews_removes_and_forgets(redis_client: redis.Redis) -> None:
    """A beat replaces the api's entry; remove drops it; a beat forgets entries older than
    API_FORGET_MS and skips unreadable ones when listing."""
    ks = Keyspace("sbt:")
    beats = ApiHeartbeats(redis_client, ks)
    now = 10 * API_FORGET_MS
    beats.beat(ApiBeat("h:1", "h", 1, "http://a", now - API_FORGET_MS - 1))
    beats.beat(ApiBeat("h:2", "h", 2, "http://b", now - 5))
    redis_client.hset(ks.apis, "h:junk", "not json")
    assert [b.api_id for b in beats.all()] == ["h:1", "h:2"]
    beats.beat(ApiBeat("h:2", "h", 2, "http://b", now))  # forgets h:1, renews h:2
    assert beats.all() == [ApiBeat("h:2", "h", 2, "http://b", now)]
    beats.remove("h:2")
    assert beats.all() == []
    assert redis_client.hkeys(ks.apis) == [b"h:junk"]
