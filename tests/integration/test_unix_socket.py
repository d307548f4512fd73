"""`SWITCHBOARD_REDIS_URL=unix:///path.sock?db=N`: a real api, worker and beat on a private
Redis reached only through its unix socket serve a send with its wait and its announce."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from switchboard.supervisor.redis_server import RedisServer
from switchboard_testkit.procs import send_and_wait

pytestmark = pytest.mark.integration

DB = 2


@pytest.fixture
def socket_server() -> Iterator[RedisServer]:
    # A short directory: a unix socket's path may not pass 107 bytes.
    short = Path(tempfile.mkdtemp(prefix="sb-sock-"))
    try:
        with RedisServer(short, unix_socket=short / "redis.sock") as server:
            yield server
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_api_worker_and_beat_serve_a_send_over_a_unix_socket(
    socket_server: RedisServer, switchboard_procs: Any, tmp_path: Path
) -> None:
    sock = socket_server.unix_socket
    assert sock is not None
    switchboard_procs.env["SWITCHBOARD_REDIS_URL"] = f"unix://{sock}?db={DB}"
    with switchboard_procs.serving() as (url, _):
        result = send_and_wait(url, "agent:main:sock", "over the socket")
        assert result["status"] == "ok" and result["reply"] == "over the socket", result
        with httpx.Client(base_url=url, headers={"Authorization": "Bearer t"}, timeout=40) as http:
            # The announce reaches the requester: the send's own flow, done by the worker.
            deadline = time.monotonic() + 30
            while True:
                hist = http.post(
                    "/tools/invoke",
                    json={"tool": "sessions_history", "args": {"sessionKey": "main"}},
                )
                texts = str(hist.json()["result"]["messages"])
                if "over the socket" in texts or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert "over the socket" in texts
    for log_file in tmp_path.glob("*.log"):  # the api's, the worker's and the beat's
        log, name = log_file.read_text(), log_file.stem
        failed = [line for line in log.splitlines() if '"level": "error"' in line]
        failed += [line for line in log.splitlines() if '"level": "critical"' in line]
        assert not failed, f"{name}: {failed[:3]}"
    with (
        redis.Redis(unix_socket_path=str(sock), db=DB) as db,
        redis.Redis(unix_socket_path=str(sock), db=0) as db0,
    ):
        assert db.dbsize() > 0  # the state and the queues in the database the URL names
        assert db0.dbsize() == 0
