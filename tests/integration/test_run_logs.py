"""Structured logs of a real worker: run, flow and spawn context on the lines, no secrets."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from switchboard.logs import configured_secrets, formatter
from switchboard.shared.config import Settings, SwitchboardConfig
from switchboard.shared.delivery import records
from switchboard.shared.flows.a2a_flow import get_flow
from switchboard.shared.services import Services
from switchboard_testkit.calls import invoke, wait_until
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
ROOM = "agent:main:relay:group:room1"
API_KEY = "sk-live-0123456789abcdefghijklmn"
HOOK_SECRET = "hook-header-secret-42"


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    """The `relay` channel's webhook receiver (it refuses, so the delivery fails)."""
    with WebhookReceiver(default_status=400) as receiver:
        yield receiver


@pytest.fixture
def config_data(webhook: WebhookReceiver) -> dict[str, Any]:
    """A keyed provider and a webhook with a secret header: credentials that must not leak."""
    return {
        "tools": {"sessions": {"visibility": "agent"}},
        "session": {"agentToAgent": {"maxPingPongTurns": 1}},
        "models": {
            "providers": {"vendor": {"baseUrl": "http://127.0.0.1:9/v1", "apiKey": API_KEY}}
        },
        "channels": {"relay": {"webhook": {"url": webhook.url, "headers": {"X-Key": HOOK_SECRET}}}},
    }


@pytest.fixture
def log_lines(
    worker: Any, settings: Settings, config: SwitchboardConfig
) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Every record of this process (worker threads included) as the product renders it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter("json", configured_secrets(settings, config)))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)  # after the worker started: it sets the root level too
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(level)


def ended(lines: list[dict[str, Any]], run_id: str) -> dict[str, Any]:
    """The `run … ended` line of a run."""
    [line] = [x for x in lines if x.get("runId") == run_id and " ended: " in x["event"]]
    return line


def test_run_flow_and_spawn_lines_carry_their_context(
    log_lines: Callable[[], list[dict[str, Any]]], client: httpx.Client, services: Services
) -> None:
    """Run lines name run and session; flow runs and steps their flow; a child its parent."""
    sent = invoke(client, "sessions_send", sessionKey=ROOM, message="/reply hi", timeoutSeconds=20)
    flow_id = sent["flowId"]
    flow = wait_until(
        lambda: (f := get_flow(services, flow_id)) and f["status"] == "done" and f, "the flow"
    )
    delivery_id = flow["announce"]["deliveryId"]
    wait_until(
        lambda: (d := records.get(services, delivery_id)) and d["status"] == "failed", "delivery"
    )
    spawned = invoke(client, "sessions_spawn", task="go\n/reply child done")
    wait_until(
        lambda: any(x.get("runId") == spawned["runId"] for x in log_lines()), "the child's lines"
    )
    lines = log_lines()

    primary = ended(lines, sent["runId"])
    assert (primary["level"], primary["logger"], primary["status"]) == (
        "info",
        "switchboard.run",
        "ok",
    )
    assert (primary["sessionKey"], primary["flowId"]) == (ROOM, flow_id)
    round_one = ended(lines, flow["rounds"][1]["runId"])
    assert (round_one["sessionKey"], round_one["flowId"]) == (MAIN, flow_id)
    assert ended(lines, flow["announce"]["runId"])["flowId"] == flow_id

    steps = [x for x in lines if x.get("step") == "switchboard.a2a_step"]
    assert {x["flowId"] for x in steps} == {flow_id}
    assert {x["turn"] for x in steps} == {"0", "1"}
    [failed] = [x for x in lines if x["event"].startswith(f"delivery {delivery_id} failed")]
    assert failed["level"] == "warning"
    assert (failed["deliveryId"], failed["flowId"], failed["sessionKey"]) == (
        delivery_id,
        flow_id,
        ROOM,
    )

    child = ended(lines, spawned["runId"])
    assert child["sessionKey"] == spawned["childSessionKey"]
    assert child["parentSessionKey"] == child["spawnedBy"] == MAIN
    assert child["spawnId"] == services.store.runs.get(spawned["runId"]).meta["spawnId"]  # type: ignore[union-attr]
    assert "flowId" not in child


def test_the_token_and_keys_never_appear_in_the_logs(
    log_lines: Callable[[], list[dict[str, Any]]], rpc: Callable[..., Any], settings: Settings
) -> None:
    """A provider error quoting every credential is logged (its DEBUG traceback too) without
    them."""
    token = str(settings.token)
    message = f"/fail upstream rejected token {token}, key {API_KEY}, header {HOOK_SECRET}"
    run = rpc("agent", sessionKey="main", message=message)
    outcome = rpc("agent.wait", runId=run["runId"], timeoutMs=20_000)
    assert outcome["status"] == "error"
    lines = wait_until(
        lambda: (x := log_lines()) and any(" ended: " in y["event"] for y in x) and x, "the end"
    )
    text = json.dumps(lines)
    for secret in (token, API_KEY, HOOK_SECRET):
        assert secret not in text
    line = ended(lines, run["runId"])
    assert line["error"].count("[REDACTED]") == 3
    # A model's failure: named in the end line; its traceback is a DEBUG line.
    [failed] = [x for x in lines if x["event"] == f"run {run['runId']}: the model failed"]
    assert failed["runId"] == run["runId"] and failed["level"] == "debug"
    assert "rejected token [REDACTED], key [REDACTED], header [REDACTED]" in failed["exception"]
