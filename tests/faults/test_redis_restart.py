"""Redis restarts under load (append-only, fsync always): the api degrades to 503 with
Retry-After while it is down, and everything acknowledged before completes once it is
back, without anyone restarting the worker, beat or api."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from faultkit import TOKEN, Cluster, count_by, wait_until

from switchboard.supervisor.redis_server import RedisServer

pytestmark = pytest.mark.faults

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SESSIONS = 20
RUNS_PER_SESSION = 3
# A request must never hang: every answer while Redis is down comes within this.
REQUEST_TIMEOUT_S = 15.0


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A dedicated Redis with append-only on and every write fsynced."""
    with RedisServer(tmp_path / "redis", appendonly=True) as server:
        with server.client() as admin:
            admin.config_set("appendfsync", "always")
        yield server


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    resp = httpx.post(f"{url}{path}", json=body, headers=AUTH, timeout=REQUEST_TIMEOUT_S + 5)
    return resp, time.monotonic() - started


def test_redis_restart_under_load_degrades_to_503_then_resumes(
    make_cluster: Callable[[str], Cluster], aof_redis: RedisServer
) -> None:
    """Runs acknowledged before the restart all end ok; meanwhile /rpc, /tools/invoke and
    agent.wait answer 503 + Retry-After, never 500 and never a hang."""
    cluster = make_cluster(aof_redis.url)
    cluster.worker(concurrency=16)
    cluster.beat()
    _, url = cluster.api()
    acknowledged = []
    for i in range(SESSIONS):
        for j in range(RUNS_PER_SESSION):
            body = {
                "method": "agent",
                "params": {"sessionKey": f"load-{i}", "message": f"/sleep 1\nrun {i}.{j}"},
            }
            resp, _ = _post(url, "/rpc", body)
            assert resp.status_code == 200, resp.text
            acknowledged.append(resp.json()["runId"])
    in_flight = count_by(r.status for r in cluster.runs())
    print(f"\nacknowledged {len(acknowledged)} runs; at the restart: {in_flight}")

    # A client already waiting when Redis goes away gets a 503 too, not a hang.
    early: list[tuple[httpx.Response, float]] = []
    wait_body = {"method": "agent.wait", "params": {"runId": acknowledged[-1], "timeoutMs": 60_000}}
    waiting = threading.Thread(target=lambda: early.append(_post(url, "/rpc", wait_body)))
    waiting.start()
    time.sleep(0.5)
    aof_redis.stop()
    down_at = time.monotonic()

    requests: dict[str, tuple[str, dict[str, Any]]] = {
        "agent": ("/rpc", {"method": "agent", "params": {"sessionKey": "late", "message": "hi"}}),
        "agent.wait": ("/rpc", wait_body),
        "sessions.list": ("/rpc", {"method": "sessions.list", "params": {}}),
        "tools/invoke": ("/tools/invoke", {"tool": "sessions_list", "args": {}}),
    }
    for name, (path, body) in requests.items():
        resp, took = _post(url, path, body)
        assert resp.status_code == 503, f"{name}: {resp.status_code} {resp.text}"
        assert resp.headers.get("retry-after"), f"{name}: no Retry-After"
        assert resp.json()["error"]["type"] == "unavailable", f"{name}: {resp.text}"
        assert took < REQUEST_TIMEOUT_S, f"{name} took {took:.1f}s"
        print(f"{name}: 503 in {took:.2f}s")
    health = httpx.get(f"{url}/healthz", timeout=REQUEST_TIMEOUT_S + 5)
    assert health.status_code == 503, health.text
    waiting.join(REQUEST_TIMEOUT_S + 5)
    assert early, "the waiting client never got an answer"
    assert early[0][0].status_code in (200, 503), early[0][0].text

    time.sleep(max(0.0, 3 - (time.monotonic() - down_at)))  # down for a few seconds
    aof_redis.start()
    back_at = time.monotonic()
    print(f"redis down for {back_at - down_at:.1f}s")

    def all_ended() -> bool:
        found = cluster.services.store.runs.get_many(acknowledged)
        return all(r is not None and r.terminal for r in found)

    wait_until(all_ended, 120, "every acknowledged run to end", 0.5)
    print(
        f"all {len(acknowledged)} acknowledged runs ended {time.monotonic() - back_at:.1f}s after"
    )
    runs = [r for r in cluster.services.store.runs.get_many(acknowledged) if r is not None]
    assert len(runs) == len(acknowledged)
    attempts = count_by(r.attempt for r in runs)
    print(f"attempts per run: {attempts}")
    failed = [(r.run_id, r.status, r.error) for r in runs if r.status != "ok"]
    assert not failed, f"runs that did not end ok: {failed}"
    # A run in flight when the store went away is run once more at most: leases that
    # lapsed while nobody could renew them get one more lease after the outage.
    assert max(attempts) <= 2, f"runs claimed more than twice: {attempts}"
    for i in range(SESSIONS):
        transcript = cluster.services.store.transcripts.all(f"agent:main:load-{i}")
        assert [m["role"] for m in transcript] == ["user", "assistant"] * RUNS_PER_SESSION
        replies = [m["content"][0]["text"] for m in transcript if m["role"] == "assistant"]
        assert replies == [f"run {i}.{j}" for j in range(RUNS_PER_SESSION)]
    again, _ = _post(url, "/rpc", wait_body)
    assert again.status_code == 200 and again.json()["status"] == "ok", again.text


def _invoke_send(url: str, asker: str, message: str, timeout_s: int) -> dict[str, Any]:
    """A client's waiting ``sessions_send`` into ``relay-target``, acting for ``asker``."""
    body = {
        "tool": "sessions_send",
        "sessionKey": asker,
        "args": {"sessionKey": "relay-target", "message": message, "timeoutSeconds": timeout_s},
    }
    resp, took = _post(url, "/tools/invoke", body)
    return {"status": resp.status_code, "body": resp.json(), "took": took}


@pytest.mark.parametrize(
    ("down_s", "timeout_s", "expected"),
    # Down past the wait's first poll (5 s after the send), then back within the wait;
    # down past the whole wait.
    [(6.0, 30, "ok"), (6.0, 3, "timeout")],
    ids=["back-within-the-wait", "away-past-the-wait"],
)
def test_a_waiting_send_rides_out_a_redis_restart(
    make_cluster: Callable[[str], Cluster],
    aof_redis: RedisServer,
    down_s: float,
    timeout_s: int,
    expected: str,
) -> None:
    """A send is made before its wait: Redis going away during the wait must not answer
    503, which a client retries, sending the message twice. Back within the wait, the
    reply comes; away past it, the answer is the send's timeout (the message was
    delivered); either way the send made exactly one flow, and its run ends ok."""
    cluster = make_cluster(aof_redis.url)
    cluster.worker(concurrency=4)
    cluster.beat()
    _, url = cluster.api()
    asker = f"agent:main:hook:asker-{expected}"
    answers: list[dict[str, Any]] = []
    sending = threading.Thread(
        target=lambda: answers.append(_invoke_send(url, asker, "/sleep 2\n/reply pong", timeout_s))
    )
    sending.start()
    wait_until(
        lambda: any(r.status == "running" for r in cluster.runs()),
        30,
        "the target run to start",
        0.05,
    )
    aof_redis.stop()
    time.sleep(down_s)
    aof_redis.start()
    sending.join(timeout_s + REQUEST_TIMEOUT_S)
    assert answers, "the waiting send never got an answer"
    answer = answers[0]
    took = answer["took"]
    print(f"\nRedis down {down_s:.0f}s; the send answered {answer['status']} after {took:.1f}s")
    assert answer["status"] == 200, answer
    result = answer["body"]["result"]
    assert result["status"] == expected, result
    if expected == "ok":
        assert result["reply"] == "pong", result
    else:
        assert "No reply within 3s" in result["error"], result
        assert took < down_s, answer  # answered at its deadline, not once Redis was back
    assert result["flowId"] and result["runId"]

    def ended() -> bool:
        run = cluster.services.store.runs.get(result["runId"])
        return run is not None and run.terminal

    wait_until(ended, 60, "the target run to end", 0.2)
    run = cluster.services.store.runs.get(result["runId"])
    assert run is not None and run.status == "ok", run
    flows = [f for f in cluster.flows() if f["requesterSessionKey"] == asker]
    assert [f["flowId"] for f in flows] == [result["flowId"]], flows
