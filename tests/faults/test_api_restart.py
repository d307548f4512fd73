"""The api restarts while a client waits on a run: waiting again by runId gets the outcome.

Run outcomes live in Redis, not in the api process, so any api process (a restarted one
or another behind the load balancer) answers ``agent.wait`` for a run it never saw.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from faultkit import TOKEN, Cluster, free_port

pytestmark = pytest.mark.faults

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _rpc(url: str, method: str, timeout_s: float = 30, **params: Any) -> httpx.Response:
    body = {"method": method, "params": params}
    return httpx.post(f"{url}/rpc", json=body, headers=AUTH, timeout=timeout_s)


def test_agent_wait_after_an_api_restart_returns_the_outcome(cluster: Cluster) -> None:
    """kill -9 the api mid-wait; the client's wait breaks; the same wait on the new api
    process answers with the run's reply."""
    cluster.worker(concurrency=4)
    port = free_port()
    booted = time.monotonic()
    first, url = cluster.api(port)
    # The run outlasts the restart (however slow this machine starts an api today).
    sleep_s = round(2 * (time.monotonic() - booted) + 5)
    message = f"/sleep {sleep_s}\nsurvived the api"
    accepted = _rpc(url, "agent", sessionKey="main", message=message)
    assert accepted.status_code == 200, accepted.text
    run_id = accepted.json()["runId"]

    broken: list[BaseException] = []

    def wait_long() -> None:
        try:
            _rpc(url, "agent.wait", timeout_s=90, runId=run_id, timeoutMs=60_000)
        except httpx.HTTPError as exc:
            broken.append(exc)

    waiter = threading.Thread(target=wait_long)
    waiter.start()
    time.sleep(1.0)  # the wait is parked in the api
    cluster.kill(first)
    waiter.join(10)
    assert not waiter.is_alive() and broken, "the client's wait did not break with the api"

    _, url = cluster.api(port)
    run = cluster.services.store.runs.get(run_id)
    assert run is not None and not run.terminal, "the run ended before the api came back"
    started = time.monotonic()
    answer = _rpc(url, "agent.wait", timeout_s=90, runId=run_id, timeoutMs=60_000)
    assert answer.status_code == 200, answer.text
    outcome = answer.json()
    print(f"\nwait answered {time.monotonic() - started:.1f}s after the api came back")
    assert outcome["runId"] == run_id
    assert outcome["status"] == "ok"
    assert outcome["reply"] == "survived the api"
    again = _rpc(url, "agent.wait", runId=run_id, timeoutMs=0).json()
    assert (again["status"], again["reply"]) == ("ok", "survived the api")
