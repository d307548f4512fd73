"""Metrics end to end, parsed with prometheus_client's own parser: runs, a reply-back flow and
a spawn on a real worker, then a scrape of the real api (api and worker in this process,
sharing their services: the api's /metrics shows both's counts); and real api and worker
processes, each serving its own counts (the worker on SWITCHBOARD_METRICS_PORT), or every
process of the host through prometheus_client's multiprocess mode."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from switchboard.shared.delivery import records
from switchboard.shared.flows.a2a_flow import get_flow
from switchboard.shared.services import Services
from switchboard_testkit.calls import invoke, wait_until
from switchboard_testkit.up import free_port
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration

ROOM = "agent:main:relay:group:room1"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def config_data(webhook: WebhookReceiver) -> dict[str, Any]:
    """A `relay` webhook channel, two reply-back rounds, same-agent visibility."""
    return {
        "tools": {"sessions": {"visibility": "agent"}},
        "channels": {"relay": {"webhook": {"url": webhook.url}}},
        "session": {"agentToAgent": {"maxPingPongTurns": 2}},
    }


def scrape(client: httpx.Client) -> Samples:
    """Every sample of a scrape, keyed by (sample name, labels)."""
    resp = client.get("/metrics")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parsed(resp.text)


def parsed(text: str) -> Samples:
    """The samples of a Prometheus text page."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when the series is absent)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def settled(services: Services, delivery_id: str | None) -> bool:
    """Whether a delivery reached a final status."""
    found = records.get(services, delivery_id) if delivery_id else None
    return found is not None and found["status"] in records.TERMINAL_STATUSES


def test_metrics_need_the_token(api_url: str) -> None:
    """/metrics answers 401 without the bearer token or with a wrong one."""
    assert httpx.get(f"{api_url}/metrics").status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert httpx.get(f"{api_url}/metrics", headers=wrong).status_code == 401


def test_counts_runs_rounds_announces_and_deliveries_exactly(
    worker: Any,
    client: httpx.Client,
    rpc: Callable[..., Any],
    services: Services,
    webhook: WebhookReceiver,
) -> None:
    """One ok run, one failed run, a two-round send with its announce, and a spawn."""
    ok = rpc("agent", sessionKey="main", message="hello")
    assert rpc("agent.wait", runId=ok["runId"], timeoutMs=20_000)["status"] == "ok"
    bad = rpc("agent", sessionKey="hook:bad", message="/fail boom")
    assert rpc("agent.wait", runId=bad["runId"], timeoutMs=20_000)["status"] == "error"

    sent = invoke(client, "sessions_send", sessionKey=ROOM, message="/reply hi", timeoutSeconds=20)
    assert sent["status"] == "ok"
    flow = wait_until(
        lambda: (f := get_flow(services, sent["flowId"])) and f["status"] == "done" and f,
        "the reply-back flow",
    )
    assert [r["turn"] for r in flow["rounds"]] == [0, 1, 2]
    wait_until(lambda: settled(services, flow["announce"].get("deliveryId")), "a2a delivery")
    assert len(webhook.received) == 1

    spawned = invoke(client, "sessions_spawn", task="go\n/reply child done")
    spawn_id = str(services.store.runs.get(spawned["runId"]).meta["spawnId"])  # type: ignore[union-attr]
    spawn = wait_until(
        lambda: (s := services.store.spawns.get(spawn_id)) and s.get("status") == "done" and s,
        "the spawn's announce",
    )
    wait_until(lambda: settled(services, spawn.get("deliveryId")), "the announce delivery")

    samples = wait_until(
        lambda: (
            (s := scrape(client))
            and value(s, "switchboard_queue_depth", queue="sb.flows") == 0
            and s
        ),
        "the queues to drain",
    )
    runs = 1 + 1 + 4 + 1  # ok, error, (primary, round 1, round 2, announce), child
    assert value(samples, "switchboard_runs_started_total") == runs
    assert value(samples, "switchboard_runs_ended_total", status="ok") == runs - 1
    assert value(samples, "switchboard_runs_ended_total", status="error") == 1
    assert value(samples, "switchboard_runs_ended_total", status="timeout") == 0
    assert value(samples, "switchboard_run_duration_seconds_count") == runs
    assert value(samples, "switchboard_run_duration_seconds_bucket", le="+Inf") == runs
    assert 0 < value(samples, "switchboard_run_duration_seconds_sum") < 60
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for (name, labels), v in samples.items()
        if name == "switchboard_run_duration_seconds_bucket"
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert value(samples, "switchboard_a2a_rounds_total") == 2
    assert value(samples, "switchboard_announces_total", kind="a2a", outcome="delivered") == 1
    assert value(samples, "switchboard_announces_total", kind="subagent", outcome="delivered") == 1
    assert value(samples, "switchboard_deliveries_total", outcome="delivered") == 2
    assert value(samples, "switchboard_deliveries_total", outcome="failed") == 0
    assert value(samples, "switchboard_parked_runs") == 0
    assert value(samples, "switchboard_active_runs") == 0
    for queue in ("sb.runs", "sb.flows", "sb.sweep"):
        assert value(samples, "switchboard_queue_depth", queue=queue) == 0


def test_skipped_announce_and_failed_delivery_are_counted_by_outcome(
    worker: Any, client: httpx.Client, services: Services, webhook: WebhookReceiver
) -> None:
    """A child answering ANNOUNCE_SKIP counts `skipped` (delivery status `dismissed`); a
    webhook refusing counts `failed`."""
    spawned = invoke(client, "sessions_spawn", task="go\n/reply ANNOUNCE_SKIP")
    spawn_id = str(services.store.runs.get(spawned["runId"]).meta["spawnId"])  # type: ignore[union-attr]
    spawn = wait_until(
        lambda: (s := services.store.spawns.get(spawn_id)) and s.get("status") == "done" and s,
        "the spawn to finish",
    )
    assert spawn.get("announce") == "skipped"
    webhook.respond(400)  # a permanent error: failed at once, no retry
    sent = invoke(client, "sessions_send", sessionKey=ROOM, message="/reply x", timeoutSeconds=0)
    flow = wait_until(
        lambda: (f := get_flow(services, sent["flowId"])) and f["status"] == "done" and f,
        "the reply-back flow",
    )
    wait_until(lambda: settled(services, flow["announce"].get("deliveryId")), "the delivery")
    samples = scrape(client)
    assert value(samples, "switchboard_announces_total", kind="subagent", outcome="skipped") == 1
    assert value(samples, "switchboard_announces_total", kind="subagent", outcome="delivered") == 0
    assert value(samples, "switchboard_announces_total", kind="a2a", outcome="delivered") == 1
    assert value(samples, "switchboard_deliveries_total", outcome="failed") == 1
    assert value(samples, "switchboard_deliveries_total", outcome="delivered") == 0
    # The same completion in OpenClaw 2026.9.6's delivery vocabulary; every status shows.
    statuses = ("pending", "delivered", "session_queued", "failed", "parent_missing")
    assert value(samples, "switchboard_subagent_deliveries_total", status="dismissed") == 1
    for status in (*statuses, "not_applicable"):
        assert value(samples, "switchboard_subagent_deliveries_total", status=status) == 0


def test_queue_depths_sum_every_priority_list(
    client: httpx.Client, rpc: Callable[..., Any], celery_app: Celery
) -> None:
    """Without a worker, queued messages show per queue, high-priority lists included."""
    rpc("agent", sessionKey="hook:one", message="hi")
    rpc("agent", sessionKey="hook:two", message="hi")
    celery_app.send_task("switchboard.deliver", args=["none"], queue="sb.flows", priority=9)
    samples = scrape(client)
    assert value(samples, "switchboard_queue_depth", queue="sb.runs") == 2
    assert value(samples, "switchboard_queue_depth", queue="sb.flows") == 1
    assert value(samples, "switchboard_queue_depth", queue="sb.sweep") == 0
    assert value(samples, "switchboard_runs_started_total") == 0


def test_parked_waits_are_a_gauge(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """A run parked on a waiting sessions_send shows as parked until its target ends."""
    args = {"sessionKey": "hook:inner", "message": "/sleep 2\n/reply inner", "timeoutSeconds": 10}
    caller = rpc("agent", sessionKey="main", message="/tool sessions_send " + json.dumps(args))
    wait_until(
        lambda: (r := services.store.runs.get(caller["runId"])) and r.status == "parked",
        "the caller to park",
    )
    assert value(scrape(client), "switchboard_parked_runs") == 1
    assert rpc("agent.wait", runId=caller["runId"], timeoutMs=20_000)["status"] == "ok"
    # A run's end is counted just after its end is written, on the thread that ran it: the
    # caller's wait can return before the target's count lands, so wait for both counts.
    bucket = "switchboard_run_duration_seconds_bucket"
    samples = wait_until(
        lambda: (
            (s := scrape(client))
            and value(s, bucket, le="+Inf") - value(s, bucket, le="1.0") >= 2
            and s
        ),
        "both two-second runs to be counted",
    )
    assert value(samples, "switchboard_parked_runs") == 0
    # Both runs took about two seconds (the caller's time parked included); the reply-back
    # flow's own short runs may or may not have ended by now, and all fall under 1 s.
    under_1s = value(samples, bucket, le="1.0")
    assert value(samples, bucket, le="5.0") - under_1s == 2
    assert value(samples, bucket, le="+Inf") - under_1s == 2
    assert 3.5 < value(samples, "switchboard_run_duration_seconds_sum") < 10


def _one_run(url: str) -> None:
    """A run in the main session over HTTP, waited for to end ok."""
    with httpx.Client(base_url=url, headers={"Authorization": "Bearer t"}, timeout=60) as http:
        started = http.post("/rpc", json={"method": "agent", "params": {"message": "hi"}})
        run_id = started.json()["runId"]
        params = {"runId": run_id, "timeoutMs": 30_000}
        waited = http.post("/rpc", json={"method": "agent.wait", "params": params})
        assert waited.json()["status"] == "ok", waited.text


def test_a_worker_process_serves_its_own_counts(switchboard_procs: Any) -> None:
    """The worker that ran a run counts it on its metrics port; the api, which did not,
    counts none, and serves the gauges."""
    port = free_port()
    switchboard_procs.env["SWITCHBOARD_METRICS_PORT"] = str(port)
    with switchboard_procs.serving(beat=False) as (url, _):
        _one_run(url)
        worker = wait_until(
            lambda: (
                (s := parsed(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text))
                and value(s, "switchboard_runs_ended_total", status="ok") == 1
                and s
            ),
            "the worker's count",
        )
        assert value(worker, "switchboard_runs_started_total") == 1
        assert value(worker, "switchboard_run_duration_seconds_count") == 1
        with httpx.Client(base_url=url, headers={"Authorization": "Bearer t"}) as http:
            api = scrape(http)
    assert value(api, "switchboard_runs_started_total") == 0
    assert ("switchboard_active_runs", frozenset()) in api


def test_multiprocess_mode_sums_every_process_of_the_host(
    switchboard_procs: Any, tmp_path: Path
) -> None:
    """With PROMETHEUS_MULTIPROC_DIR (as `switchboard up` sets it), the api's /metrics
    shows what the worker process counted."""
    shared = tmp_path / "prometheus"
    shared.mkdir()
    switchboard_procs.env["PROMETHEUS_MULTIPROC_DIR"] = str(shared)
    with switchboard_procs.serving(beat=False) as (url, _):
        _one_run(url)
        with httpx.Client(base_url=url, headers={"Authorization": "Bearer t"}) as http:
            samples = wait_until(
                lambda: (
                    (s := scrape(http))
                    and value(s, "switchboard_runs_ended_total", status="ok") == 1
                    and s
                ),
                "the host's count",
            )
    assert value(samples, "switchboard_runs_started_total") == 1
    assert value(samples, "switchboard_runs_terminal_total", state="succeeded") == 1
