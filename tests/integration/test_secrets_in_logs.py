"""Credentials never reach the logs, and `sessions_history` redacts them.

The api and a worker run as the processes a user starts (`switchboard api`, `switchboard
worker`, DEBUG logging, whatever format the product configures), with a provider `apiKey`,
webhook headers and the api token configured. Requests carry the token (and wrong ones);
runs call the model with the key, deliver through the webhook with its headers, and fail
on purpose (a model error, a webhook error) so error paths log too. No secret appears in
either process's output.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from switchboard_testkit.fake_model import FakeModelServer
from switchboard_testkit.procs import stop_groups
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.integration

TOKEN = "tok-Zq8Vw3Lr5Tn2Xy7Pk4Jd9Hf6"
PROVIDER_KEY = "sk-live-9Fh3Kd8Lq2Wz7Xc4Vb6Nm1Pr5"
WEBHOOK_BEARER = "whsec_4Tg8Yh2Uj6Ik9Ol3Pm7Qn5Rb1"
WEBHOOK_KEY = "hdrkey-7Ws2Ed5Rf8Tg1Yh4Uj6Ik3"
ROOM = "agent:main:relay:group:room1"  # announces go to the relay channel's webhook
SECRETS = (TOKEN, PROVIDER_KEY, WEBHOOK_BEARER, WEBHOOK_KEY)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def processes(
    redis_url: str, tmp_path: Path
) -> Iterator[tuple[str, dict[str, Path], FakeModelServer, WebhookReceiver]]:
    """`switchboard api` and `switchboard worker` with secrets configured, logs to files."""
    with FakeModelServer() as model, WebhookReceiver() as hook:
        config = {
            "models": {
                "providers": {
                    "fake": {"baseUrl": model.base_url, "api": "openai", "apiKey": PROVIDER_KEY}
                }
            },
            "agents": {"defaults": {"model": "fake/fake-model"}},
            "tools": {"sessions": {"visibility": "agent"}},
            "session": {"agentToAgent": {"maxPingPongTurns": 0}},
            "channels": {
                "relay": {
                    "webhook": {
                        "url": hook.url,
                        "headers": {
                            "Authorization": f"Bearer {WEBHOOK_BEARER}",
                            "X-Api-Key": WEBHOOK_KEY,
                        },
                    }
                }
            },
            "delivery": {"maxAttempts": 2, "backoffBaseS": 0.2, "backoffMaxS": 0.5},
        }
        config_file = tmp_path / "switchboard.json5"
        config_file.write_text(json.dumps(config))
        port = free_port()
        env = {
            **os.environ,
            "SWITCHBOARD_REDIS_URL": redis_url,
            "SWITCHBOARD_TOKEN": TOKEN,
            "SWITCHBOARD_CONFIG": str(config_file),
            "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
            "SWITCHBOARD_LOG_LEVEL": "DEBUG",
            "SWITCHBOARD_AUTH_MAX_FAILURES": "3",
        }
        logs = {name: tmp_path / f"{name}.log" for name in ("api", "worker")}
        commands = {
            "api": ["api", "--port", str(port)],
            "worker": ["worker", "--concurrency", "4"],
        }
        procs = []
        for name, args in commands.items():
            with logs[name].open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "switchboard", *args],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url)
            yield url, logs, model, hook
        finally:
            stop_groups(procs, timeout_s=15)


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "api did not start"
        time.sleep(0.1)


def rpc(client: httpx.Client, method: str, **params: Any) -> Any:
    resp = client.post("/rpc", json={"method": method, "params": params})
    assert resp.status_code == 200, resp.text
    return resp.json()


def run(client: httpx.Client, **params: Any) -> dict[str, Any]:
    started = rpc(client, "agent", **params)
    outcome: dict[str, Any] = rpc(client, "agent.wait", runId=started["runId"], timeoutMs=30_000)
    return outcome


def send(client: httpx.Client, message: str) -> dict[str, Any]:
    """sessions_send from main into the relay room, waiting for the reply."""
    args = {"sessionKey": ROOM, "message": message, "timeoutSeconds": 30}
    resp = client.post("/tools/invoke", json={"tool": "sessions_send", "args": args})
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def test_credentials_never_reach_the_logs_and_history_redacts_them(
    processes: tuple[str, dict[str, Path], FakeModelServer, WebhookReceiver],
) -> None:
    """Token, provider key and webhook headers: used, logged about, never printed."""
    url, logs, model, hook = processes
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        # A send whose announce goes out through the webhook (with its headers).
        assert send(client, "hello")["status"] == "ok"
        (delivered,) = hook.wait_for(1)
        assert delivered.headers["x-api-key"] == WEBHOOK_KEY  # the headers were really used
        # Error paths: the webhook answers 500, the model fails.
        hook.respond(500)
        assert send(client, "again")["status"] == "ok"
        hook.wait_for(2)
        failed = run(client, sessionKey="agent:main:b", message="/fail")
        assert failed["status"] == "error", failed
        # Secrets inside a transcript: the model is told the key and the token.
        leak = f"use {PROVIDER_KEY} with Authorization: Bearer {TOKEN}"
        assert run(client, sessionKey="agent:main:leaky", message=leak)["status"] == "ok"
        history = client.post(
            "/tools/invoke",
            json={"tool": "sessions_history", "args": {"sessionKey": "agent:main:leaky"}},
        ).json()["result"]
        assert history["contentRedacted"] is True, history
        assert not any(secret in json.dumps(history) for secret in SECRETS), history
        # Wrong tokens (near misses of the real one) until the lockout.
        for guess in (TOKEN[:-1], TOKEN + "x", f"{TOKEN} {TOKEN}", "Basic " + TOKEN):
            client.post("/rpc", headers={"Authorization": f"Bearer {guess}"}, json={})
    time.sleep(1.0)  # let the delivery retries and their logs land
    outputs = {name: path.read_text(errors="replace") for name, path in logs.items()}
    assert "fake-model" in model.requests()[0]["model"]
    for name, text in outputs.items():
        assert text.strip(), f"{name} logged nothing: the check would be vacuous"
        for secret in SECRETS:
            for part in (secret, secret[:12], secret[-12:]):
                assert part not in text, f"{name} log shows a credential fragment {part!r}"
    assert "error" in outputs["worker"].lower(), "the failures were not logged at all"
