"""Runs through the real api, a real Redis and a real Celery worker."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from switchboard.shared.flows import sweeper
from switchboard.shared.flows.steps import inline_services
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.queue import RunsTakenHere
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms

pytestmark = pytest.mark.integration


def wait_ok(rpc: Callable[..., Any], run_id: str, timeout_ms: int = 20_000) -> dict[str, Any]:
    """Wait for a run and return its outcome."""
    outcome: dict[str, Any] = rpc("agent.wait", runId=run_id, timeoutMs=timeout_ms)
    return outcome


def test_agent_then_wait_returns_the_runs_reply(worker: Any, rpc: Callable[..., Any]) -> None:
    """`agent` answers accepted at once; `agent.wait` returns that run's own reply."""
    started = rpc("agent", sessionKey="main", message="hello there")
    assert started["status"] == "accepted"
    assert started["sessionKey"] == "main"
    outcome = wait_ok(rpc, started["runId"])
    assert outcome == {
        "runId": started["runId"],
        "status": "ok",
        "reply": "hello there",
        "startedAt": outcome["startedAt"],
        "endedAt": outcome["endedAt"],
    }
    history = rpc("chat.history", sessionKey="main")
    assert [m["role"] for m in history["messages"]] == ["user", "assistant"]
    assert history["messages"][0]["content"] == "hello there"
    assert history["messages"][0]["provenance"]["kind"] == "external_user"
    assert history["messages"][1]["content"][0]["text"] == "hello there"
    assert [m["__openclaw"]["seq"] for m in history["messages"]] == [1, 2]


def test_wait_times_out_but_the_run_continues(worker: Any, rpc: Callable[..., Any]) -> None:
    """A short wait answers `timeout`; waiting again by runId later gets the outcome."""
    started = rpc("agent", sessionKey="main", message="/sleep 1.5\nslow one")
    first = rpc("agent.wait", runId=started["runId"], timeoutMs=200)
    assert first["status"] == "timeout"
    second = wait_ok(rpc, started["runId"])
    assert second["status"] == "ok"
    assert second["reply"] == "slow one"


def test_failed_model_call_ends_the_run_as_error(worker: Any, rpc: Callable[..., Any]) -> None:
    """A model failure gives `status: error` with the reason, and frees the session."""
    started = rpc("agent", sessionKey="main", message="/fail provider exploded")
    outcome = wait_ok(rpc, started["runId"])
    assert outcome["status"] == "error"
    assert "provider exploded" in outcome["error"]
    again = rpc("agent", sessionKey="main", message="still alive")
    assert wait_ok(rpc, again["runId"])["reply"] == "still alive"


def test_run_deadline_is_enforced_by_the_product(worker: Any, rpc: Callable[..., Any]) -> None:
    """A run over its timeout ends as `timeout` although the threads pool has no limits."""
    started = rpc("agent", sessionKey="main", message="/sleep 30\nnever", timeout=1)
    outcome = wait_ok(rpc, started["runId"])
    assert outcome["status"] == "timeout"
    assert "timed out after 1s" in outcome["error"]


def test_twenty_concurrent_messages_run_one_at_a_time_in_order(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """Messages to one session never overlap, each reply follows its own message."""
    messages = [f"/sleep 0.05\nmessage {i}" for i in range(20)]
    with ThreadPoolExecutor(max_workers=20) as pool:
        started = list(pool.map(lambda m: rpc("agent", sessionKey="main", message=m), messages))
    outcomes = [wait_ok(rpc, s["runId"]) for s in started]
    assert all(o["status"] == "ok" for o in outcomes)
    spans = sorted((o["startedAt"], o["endedAt"]) for o in outcomes)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, "two runs of one session overlapped"
    transcript = services.store.transcripts.all("agent:main:main")
    assert [m["role"] for m in transcript] == ["user", "assistant"] * 20
    users = [m["content"] for m in transcript[::2]]
    replies = [m["content"][0]["text"] for m in transcript[1::2]]
    assert sorted(users) == sorted(messages)
    assert replies == [u.split("\n", 1)[1] for u in users]
    # The transcript order is the order the runs started in.
    by_start = sorted(outcomes, key=lambda o: o["startedAt"])
    assert [o["reply"] for o in by_start] == replies


def test_different_sessions_run_in_parallel(worker: Any, rpc: Callable[..., Any]) -> None:
    """Slow runs in five sessions overlap instead of queueing behind each other."""
    t0 = time.monotonic()
    started = [
        rpc("agent", sessionKey=f"hook:parallel-{i}", message="/sleep 1\nparallel")
        for i in range(5)
    ]
    outcomes = [wait_ok(rpc, s["runId"]) for s in started]
    elapsed = time.monotonic() - t0
    assert all(o["status"] == "ok" for o in outcomes)
    latest_start = max(o["startedAt"] for o in outcomes)
    earliest_end = min(o["endedAt"] for o in outcomes)
    assert latest_start < earliest_end, "the runs did not overlap"
    assert elapsed < 4.5


def test_idempotency_key_returns_the_same_run(worker: Any, rpc: Callable[..., Any]) -> None:
    """A retried `agent` call with the same idempotencyKey does not start a second run."""
    a = rpc("agent", sessionKey="main", message="once", idempotencyKey="k-1")
    b = rpc("agent", sessionKey="main", message="once", idempotencyKey="k-1")
    assert a["runId"] == b["runId"]
    wait_ok(rpc, a["runId"])
    assert len(rpc("chat.history", sessionKey="main")["messages"]) == 2


def test_usage_is_recorded_on_the_session(worker: Any, rpc: Callable[..., Any]) -> None:
    """Model, token counts and the latest run status land on the session entry."""
    wait_ok(rpc, rpc("agent", sessionKey="main", message="one two three")["runId"])
    rows = rpc("sessions.list")["sessions"]
    (row,) = [r for r in rows if r["key"] == "agent:main:main"]
    assert row["model"] == "echo"
    assert row["modelProvider"] == "builtin"
    assert row["outputTokens"] == 3
    assert row["totalTokens"] == row["inputTokens"] + row["outputTokens"]
    assert row["status"] == "ok"
    assert row["kind"] == "main"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"method": "agent", "params": {"sessionKey": "agent::x", "message": "hi"}}, 400),
        ({"method": "agent", "params": {"sessionKey": "main"}}, 400),
        ({"method": "agent", "params": {"sessionKey": 5, "message": "hi"}}, 400),
        ({"method": "nope", "params": {}}, 404),
        ({"method": "agent.wait", "params": {"runId": "missing", "timeoutMs": 10}}, 404),
        ({"method": "chat.history", "params": {"sessionKey": "main", "limit": 5000}}, 400),
        (
            {
                "method": "chat.history",
                "params": {"sessionKey": "00000000-0000-4000-8000-000000000000"},
            },
            404,
        ),
        ({"params": {}}, 400),
    ],
)
def test_bad_input_gets_a_clear_4xx_and_changes_nothing(
    api_url: str, client: httpx.Client, services: Services, body: dict[str, Any], status: int
) -> None:
    """Malformed keys, missing fields, wrong types, unknown methods: 4xx, Redis untouched."""
    before = services.store.redis.dbsize()
    resp = client.post("/rpc", json=body)
    assert resp.status_code == status, resp.text
    err = resp.json()
    assert err["ok"] is False
    assert err["error"]["message"]
    assert services.store.redis.dbsize() == before


def test_invalid_json_and_oversize_bodies_are_rejected(client: httpx.Client) -> None:
    """Invalid JSON → 400, invalid UTF-8 → 400, over 2 MB → 413; all JSON errors."""
    bad = client.post("/rpc", content=b"{not json")
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == "request body is not valid JSON"
    assert client.post("/rpc", content=b'{"method": "\xff"}').status_code == 400
    big = client.post("/rpc", content=b"x" * (2 * 1024 * 1024 + 1))
    assert big.status_code == 413
    assert big.json()["error"]["type"] == "payload_too_large"


def test_auth_is_required_except_healthz(api_url: str) -> None:
    """No or wrong token → 401; /healthz answers without one."""
    assert httpx.get(f"{api_url}/healthz").status_code == 200
    body = {"method": "sessions.list", "params": {}}
    assert httpx.post(f"{api_url}/rpc", json=body).status_code == 401
    wrong = httpx.post(f"{api_url}/rpc", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["type"] == "unauthorized"
    assert httpx.post(f"{api_url}/tools/invoke", json={"tool": "x"}).status_code == 401


def test_a_result_that_cannot_be_recorded_ends_the_run_and_frees_the_lane(
    worker: Any, rpc: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model answer the store cannot take ends the run as an error at once, not stranded."""
    from switchboard.shared.runtime import executor

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise ValueError("unstorable tool arguments")

    monkeypatch.setattr(executor, "_queue_result", refuse)
    first = rpc("agent", sessionKey="main", message="one")
    outcome = wait_ok(rpc, first["runId"])
    assert outcome["status"] == "error", outcome
    assert "could not be recorded" in outcome["error"]
    assert "unstorable tool arguments" in outcome["error"]
    monkeypatch.undo()
    second = rpc("agent", sessionKey="main", message="two")
    again = wait_ok(rpc, second["runId"])
    assert (again["status"], again.get("reply")) == ("ok", "two"), again


def test_run_started_event_comes_from_the_claim(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """Each run's claim adds one `run.started` (ids, kind, attempt), before its `run.ended`."""
    from switchboard_testkit import store_reads

    started = rpc("agent", sessionKey="main", message="hello")
    assert wait_ok(rpc, started["runId"])["status"] == "ok"
    events = store_reads.events(services.store)
    mine = [(e["type"], e) for e in events if e.get("runId") == started["runId"]]
    assert [kind for kind, _ in mine] == ["run.started", "run.ended"]
    data = mine[0][1]
    assert data["sessionKey"] == "agent:main:main"
    assert (data["kind"], data["attempt"]) == ("agent", 1)
    assert isinstance(data["ts"], int) and data["ts"] <= mine[1][1]["ts"]


def test_a_run_taken_by_a_task_that_died_runs_once_its_lease_lapses(
    worker: Any, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run handed to the task whose follow-up started it sends no message; if that task
    dies before running it, the lane's lease lapses and the sweep enqueues it."""
    key = "agent:main:taken-then-lost"
    here = RunsTakenHere(services.queue, limit=1)
    started = start_run(
        inline_services(services, taken=here), RunRequest(session_key=key, message="still here")
    )
    run_id = str(started["runId"])
    assert list(here.runs) == [(run_id, key)]
    # The task dies here: it neither runs the run nor releases it.
    time.sleep(0.5)
    rec = services.store.runs.get(run_id)
    assert rec is not None and rec.status == "queued"  # no message reached the worker
    lapsed = now_ms() + int(services.settings.lane_lease_s * 1000) + 1000
    monkeypatch.setattr(sweeper, "now_ms", lambda: lapsed)
    report = sweeper.sweep(services)
    assert report.resent == 1  # a queued run whose message never came
    deadline = time.monotonic() + 15
    while (rec := services.store.runs.get(run_id)) is None or not rec.terminal:
        assert time.monotonic() < deadline, f"run stayed {rec.status if rec else None}"
        time.sleep(0.05)
    assert (rec.status, rec.reply) == ("ok", "still here")


def test_after_a_stall_a_running_run_gets_one_more_lease_before_it_is_run_again(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When nothing was swept for longer than a lease (the store was down), a running
    run's lapsed lease is extended once: its worker may be alive and renew it. If the
    lease lapses again, the next sweep runs the run again."""
    key = "agent:main:stalled"
    started = start_run(services, RunRequest(session_key=key, message="hello"))
    run_id = str(started["runId"])
    claim = services.store.runs.claim(run_id, key)
    assert not isinstance(claim, str) and claim.attempt == 1
    lease_ms = int(services.settings.lane_lease_s * 1000)
    t0 = now_ms() + lease_ms + 1000
    services.store.sweeps.mark_ran("sweep", t0 - 2 * lease_ms)  # the store was away
    monkeypatch.setattr(sweeper, "now_ms", lambda: t0)
    report = sweeper.sweep(services)
    assert (report.extended, report.requeued) == (1, 0)
    rec = services.store.runs.get(run_id)
    assert rec is not None and rec.status == "running"
    # Sweeps run again on time; nobody renewed the lease: the run is queued again.
    monkeypatch.setattr(sweeper, "now_ms", lambda: t0 + 500)
    assert sweeper.sweep(services).requeued == 0  # the extended lease still holds
    t1 = t0 + lease_ms + 1000
    services.store.sweeps.mark_ran("sweep", t1 - 500)
    monkeypatch.setattr(sweeper, "now_ms", lambda: t1)
    report = sweeper.sweep(services)
    assert (report.extended, report.requeued) == (0, 1)
    rec = services.store.runs.get(run_id)
    assert rec is not None and rec.status == "queued"
