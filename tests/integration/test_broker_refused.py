"""A broker that refuses a run's message loses nothing and answers no 500.

A run is recorded (holding its session lane with a lease) before its message goes to the
broker. When the broker refuses the message (down, failing over, a batch publish whose
outcome is uncertain), the caller is answered `accepted` as usual, one WARNING says the
sweep will queue it, and once the lease lapses the sweep does: the run then completes on
a real worker.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kombu.exceptions import BatchPublishError

from switchboard.api.app import create_app
from switchboard.shared.config import Settings, SwitchboardConfig
from switchboard.shared.errors import BrokerUnavailable
from switchboard.shared.flows.sweeper import sweep
from switchboard.shared.services import Services
from switchboard.wiring import build_services
from switchboard.workers.app import create_celery_app
from switchboard.workers.queue import CeleryQueue

pytestmark = pytest.mark.integration


@pytest.fixture
def refusing(settings: Settings, config: SwitchboardConfig) -> Iterator[Services]:
    """Services on the test's Redis whose broker is a port nothing listens on."""
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = settings.model_copy(update={"broker_url": f"redis://127.0.0.1:{port}/0"})
    svc = build_services(dead, queue=CeleryQueue(create_celery_app(dead)), config=config)
    yield svc
    svc.store.close()


def _wait_ended(services: Services, run_ids: list[str], timeout_s: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        recs = services.store.runs.get_many(run_ids)
        statuses = {r.run_id: r.status for r in recs if r is not None}
        if len(statuses) == len(run_ids) and all(s == "ok" for s in statuses.values()):
            return statuses
        time.sleep(0.1)
    return statuses


def test_a_refused_run_message_is_accepted_and_the_sweep_queues_it(
    refusing: Services,
    services: Services,
    settings: Settings,
    config: SwitchboardConfig,
    worker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A send and a batch spawn answer `accepted` with the broker down; after the lane
    lease lapses the sweep (on services whose broker is up) queues them and they end ok."""
    app = create_app(settings, config, services=refusing)
    auth = {"Authorization": f"Bearer {settings.token}"}
    with TestClient(app, raise_server_exceptions=False) as http, caplog.at_level(logging.WARNING):
        sent = http.post(
            "/rpc",
            json={"method": "agent", "params": {"sessionKey": "hook:down", "message": "hi"}},
            headers=auth,
        )
        spawned = http.post(
            "/tools/invoke",
            json={
                "tool": "sessions_spawn",
                "sessionKey": "main",
                "args": {"tasks": [{"task": "one"}, {"task": "two"}]},
            },
            headers=auth,
        )
    assert sent.status_code == 200, sent.text
    assert sent.json()["status"] == "accepted"
    assert spawned.status_code == 200, spawned.text
    result = spawned.json()["result"]
    assert result["status"] == "accepted", result
    run_ids = [sent.json()["runId"], *(r["runId"] for r in result["runs"])]
    refused = [r for r in caplog.records if "not queued, the broker refused" in r.getMessage()]
    assert len(refused) == 2, [r.getMessage() for r in caplog.records]
    assert all(rec.exc_info is None for rec in refused)  # one line each, no traceback
    assert {r.status for r in services.store.runs.get_many(run_ids) if r} == {"queued"}

    # Nothing runs them until their lease lapses and a sweep on a working broker sends them.
    time.sleep(settings.lane_lease_s + 0.5)
    report = sweep(services)
    assert report.resent == len(run_ids), report
    assert _wait_ended(services, run_ids) == dict.fromkeys(run_ids, "ok")


def test_a_batch_publish_with_an_uncertain_outcome_is_a_broker_unavailable(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu's BatchPublishError (a batch publish cut off mid-way, as in a failover) is
    raised as the domain's `BrokerUnavailable` (retried by steps, a 503 elsewhere)."""
    queue = CeleryQueue(create_celery_app(services.settings))

    def cut_off(*_: Any, **__: Any) -> None:
        raise BatchPublishError("Batch publish failed", [])

    monkeypatch.setattr(queue, "_send_many", cut_off)
    with pytest.raises(BrokerUnavailable) as raised:
        queue.enqueue_runs([("r1", "agent:main:a"), ("r2", "agent:main:b")])
    assert isinstance(raised.value.__cause__, BatchPublishError)
    assert raised.value.retry_after_s == 2
