"""RabbitMQ with quorum queues (`SWITCHBOARD_BROKER_QUEUE_TYPE=quorum`): the product's queues
are declared as quorum queues, runs go through them, and a countdown step (the wake-up of a
yielded session, sent through RabbitMQ's native delayed delivery) arrives.

A vhost of the test's own; skipped where RabbitMQ is not installed. The setting on a Redis
broker is refused at start with one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from faultkit import TOKEN, Cluster, base_config, wait_until
from scalekit import rabbitmq_vhost

from switchboard.supervisor.redis_server import RedisServer
from switchboard.workers.routing import ALL_QUEUES
from switchboard_testkit.up import clean_env
from switchboard_testkit.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.scale, pytest.mark.timeout(180)]

QUORUM = {"SWITCHBOARD_BROKER_QUEUE_TYPE": "quorum"}


@pytest.fixture(scope="module")
def quorum_api(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[httpx.Client, str]]:
    """An api, a worker and a beat on database 2 of the private Redis, RabbitMQ (quorum
    queues on a vhost of their own) as the broker; the api's client and the vhost."""
    import redis

    url = redis_server.url.rsplit("/", 1)[0] + "/2"
    with (
        redis.Redis.from_url(url) as admin,
        rabbitmq_vhost() as broker,
        WebhookReceiver() as webhook,
    ):
        assert admin.dbsize() == 0, f"{url} is not empty"
        workdir = tmp_path_factory.mktemp("quorum")
        cluster = Cluster(
            url, workdir, base_config(webhook.url), broker_url=broker, env_extra=QUORUM
        )
        try:
            worker = cluster.worker(concurrency=4)
            assert "Connected to amqp://" in worker.output()
            cluster.beat()
            _, api_url = cluster.api()
            headers = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.Client(base_url=api_url, headers=headers, timeout=60) as client:
                yield client, broker.rsplit("/", 1)[1]
        finally:
            cluster.stop_all()
            admin.flushdb()


def _invoke(client: httpx.Client, tool: str, session: str = "main", **args: Any) -> Any:
    resp = client.post("/tools/invoke", json={"tool": tool, "args": args, "sessionKey": session})
    assert resp.status_code == 200, resp.text
    return resp.json()["result"]


def _queue_types(vhost: str) -> dict[str, str]:
    """Queue name -> type (classic, quorum) in the vhost, as RabbitMQ reports them."""
    listed = subprocess.run(
        ["rabbitmqctl", "list_queues", "-p", vhost, "name", "type", "--formatter", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {row["name"]: row["type"] for row in json.loads(listed.stdout)}


def test_runs_and_a_countdown_step_go_through_quorum_queues(
    quorum_api: tuple[httpx.Client, str],
) -> None:
    """Every product queue is a quorum queue; a waiting send answers; a yielded session is
    woken by its countdown step once its children end."""
    client, vhost = quorum_api
    types = _queue_types(vhost)
    assert {types.get(name) for name in ALL_QUEUES} == {"quorum"}, types

    sent = _invoke(
        client,
        "sessions_send",
        "agent:main:hook:asker",
        sessionKey="main",
        message="/reply pong",
        timeoutSeconds=30,
    )
    assert sent["status"] == "ok" and sent["reply"] == "pong", sent

    for c in "XY":
        accepted = _invoke(client, "sessions_spawn", task=f"work\n/sleep 0.5\n/reply out-{c}")
        assert accepted["status"] == "accepted", accepted
    assert _invoke(client, "sessions_yield")["status"] == "yielded"
    started = time.monotonic()

    def woken() -> list[Any]:
        resp = client.post(
            "/rpc", json={"method": "chat.history", "params": {"sessionKey": "main"}}
        )
        assert resp.status_code == 200, resp.text
        messages = resp.json().get("messages") or []
        return [m for m in messages if "out-X" in str(m) and "out-Y" in str(m)]

    wait_until(woken, 60, "the wake-up of the yielded session")
    print(f"woken {time.monotonic() - started:.1f}s after the yield")


def test_quorum_queues_on_a_redis_broker_are_refused_in_one_line(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """A worker told to use quorum queues on Redis exits 2 naming the setting, no traceback."""
    env = {**clean_env(), **QUORUM, "SWITCHBOARD_REDIS_URL": redis_server.url}
    done = subprocess.run(
        [sys.executable, "-m", "switchboard", "worker"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert "SWITCHBOARD_BROKER_QUEUE_TYPE=quorum needs RabbitMQ" in done.stderr
    assert "Traceback" not in done.stderr
