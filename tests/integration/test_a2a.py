"""A2A, driven by the official `a2a-sdk` client against the real api and a real worker."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.client.client import Client
from a2a.helpers import get_artifact_text, new_text_message
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError

from switchboard.shared.services import Services

pytestmark = pytest.mark.integration

TOKEN = "test-token"  # the api token of the integration fixtures (conftest)
AGENTS = {"list": [{"id": "main", "default": True, "name": "Main desk"}, {"id": "ops"}]}


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Two agents; a run deadline long enough for a slow run to be cancelled."""
    return {"agents": AGENTS, "runs": {"timeoutSeconds": 60}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(token: str = TOKEN) -> httpx.AsyncClient:
    return httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)


async def a2a_client(url: str, hc: httpx.AsyncClient, *, streaming: bool) -> Client:
    """The SDK's client for the agent at ``url`` (its card fetched from the well-known path)."""
    return await create_client(url, ClientConfig(httpx_client=hc, streaming=streaming))


def message(text: str, context_id: str | None = None) -> Any:
    msg = new_text_message(text, context_id=context_id, role=Role.ROLE_USER)
    return msg


def send(text: str, *, context_id: str | None = None, now: bool = False) -> SendMessageRequest:
    return SendMessageRequest(
        message=message(text, context_id),
        configuration=SendMessageConfiguration(return_immediately=now),
    )


async def collect(stream: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    return [event async for event in stream]


def reply_of(task: Task) -> str:
    return "".join(get_artifact_text(a) for a in task.artifacts)


def run_asyncio(coro: Any) -> Any:
    return asyncio.run(coro)


class Receiver:
    """A webhook on loopback recording each POST (headers and JSON body)."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with outer.lock:
                    outer.received.append((dict(self.headers), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def states(self, task_id: str) -> list[str]:
        """The task states the notifications for ``task_id`` carried, in order."""
        out = []
        with self.lock:
            bodies = [b for _h, b in self.received]
        for body in bodies:
            for kind in ("task", "statusUpdate"):
                item = body.get(kind)
                if item and (item.get("id") or item.get("taskId")) == task_id:
                    out.append(item["status"]["state"])
        return out

    def wait_for(self, task_id: str, state: str, timeout_s: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while state not in self.states(task_id):
            assert time.monotonic() < deadline, f"no {state} push: {self.states(task_id)}"
            time.sleep(0.05)
        return self.states(task_id)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_card_send_stream_list_get_cancel(
    worker: Any, api_url: str, services: Services, rpc: Callable[..., Any]
) -> None:
    """The SDK client reads the card, sends blocking and streaming, lists, gets, cancels."""

    async def scenario() -> None:
        async with http() as hc:
            # The server's card is the default agent's; each agent has its own.
            served = (await hc.get(f"{api_url}/.well-known/agent-card.json")).json()
            assert served["name"] == "Main desk"
            ops = (await hc.get(f"{api_url}/a2a/ops/.well-known/agent-card.json")).json()
            assert ops["name"] == "ops"
            assert ops["supportedInterfaces"][0]["url"] == f"{api_url}/a2a/ops"
            assert ops["supportedInterfaces"][0]["protocolVersion"] == "1.0"
            assert ops["capabilities"] == {"streaming": True, "pushNotifications": True}
            scheme = ops["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]
            assert scheme["scheme"] == "Bearer"
            assert [s["id"] for s in ops["skills"]] == ["ops"]
            assert (await httpx.AsyncClient().get(f"{api_url}/a2a/ops")).status_code == 401

            client = await a2a_client(f"{api_url}/a2a/main", hc, streaming=False)
            card = await client.get_card() if hasattr(client, "get_card") else None
            if card is not None:
                assert card.name == "Main desk"

            # Blocking: the answer is the finished task, the reply its artifact.
            (first,) = await collect(client.send_message(send("hello there")))
            task = first.task
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert reply_of(task) == "hello there"
            key = f"agent:main:a2a:{task.context_id}"
            hist = rpc("chat.history", sessionKey=key)["messages"]
            assert [m["role"] for m in hist] == ["user", "assistant"]
            # The message is marked as coming from outside (inter-session, channel a2a).
            prov = hist[0].get("provenance") or {}
            assert (prov.get("kind"), prov.get("sourceChannel")) == ("inter_session", "a2a")

            # Streaming, in the same context (the same session).
            streamer = await a2a_client(f"{api_url}/a2a/main", hc, streaming=True)
            events = await collect(
                streamer.send_message(send("/sleep 1\nstreamed hi", context_id=task.context_id))
            )
            kinds = [e.WhichOneof("payload") for e in events]
            assert kinds == ["task", "status_update", "artifact_update", "status_update"]
            assert events[0].task.status.state == TaskState.TASK_STATE_SUBMITTED
            assert events[1].status_update.status.state == TaskState.TASK_STATE_WORKING
            assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
            artifacts = [
                e.artifact_update.artifact for e in events if e.HasField("artifact_update")
            ]
            assert [get_artifact_text(a) for a in artifacts] == ["streamed hi"]
            streamed_id = events[-1].status_update.task_id
            assert len(rpc("chat.history", sessionKey=key)["messages"]) == 4

            # Get and list.
            got = await client.get_task(GetTaskRequest(id=streamed_id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            assert reply_of(got) == "streamed hi"
            listed = await client.list_tasks(
                ListTasksRequest(context_id=task.context_id, include_artifacts=True)
            )
            assert {t.id for t in listed.tasks} == {task.id, streamed_id}
            assert listed.tasks[0].id == streamed_id  # most recent first
            ops_client = await a2a_client(f"{api_url}/a2a/ops", hc, streaming=False)
            assert list((await ops_client.list_tasks(ListTasksRequest())).tasks) == []
            with pytest.raises(TaskNotFoundError):  # another agent's task is not found
                await ops_client.get_task(GetTaskRequest(id=task.id))

            # A contextId naming another agent's session is rejected (no run).
            (refused,) = await collect(client.send_message(send("hi", context_id="agent:ops:main")))
            assert refused.task.status.state == TaskState.TASK_STATE_REJECTED
            assert "agent 'ops'" in refused.task.status.message.parts[0].text
            assert services.store.a2a_tasks.get(refused.task.id).run_id is None

            # Cancel a slow one: its run ends cancelled.
            (started,) = await collect(client.send_message(send("/sleep 30\nslow", now=True)))
            slow = started.task
            assert slow.status.state not in (
                TaskState.TASK_STATE_COMPLETED,
                TaskState.TASK_STATE_FAILED,
            )
            t0 = time.monotonic()
            cancelled = await client.cancel_task(CancelTaskRequest(id=slow.id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            assert time.monotonic() - t0 < 15
            rec = services.store.a2a_tasks.get(slow.id)
            assert rec is not None and rec.run_id is not None
            run = services.store.runs.get(rec.run_id)
            assert run is not None and run.status == "cancelled"
            again = await client.get_task(GetTaskRequest(id=slow.id))
            assert again.status.state == TaskState.TASK_STATE_CANCELED
            await client.close()
            await streamer.close()
            await ops_client.close()

    run_asyncio(scenario())


def test_push_notifications(worker: Any, api_url: str, receiver: Receiver) -> None:
    """A push config given with the message, or set on the task, is kept with the task;
    every state change is POSTed to it with its token."""

    async def scenario() -> None:
        async with http() as hc:
            client = await a2a_client(f"{api_url}/a2a/main", hc, streaming=False)
            request = send("pushed hello")
            request.configuration.task_push_notification_config.CopyFrom(
                TaskPushNotificationConfig(url=receiver.url, token="tok-1")
            )
            (first,) = await collect(client.send_message(request))
            task = first.task
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            states = receiver.wait_for(task.id, "TASK_STATE_COMPLETED")
            assert "TASK_STATE_WORKING" in states
            with receiver.lock:
                headers = [h for h, _b in receiver.received]
            assert {h.get("X-A2A-Notification-Token") for h in headers} == {"tok-1"}

            configs = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task.id)
            )
            assert [(c.url, c.token) for c in configs.configs] == [(receiver.url, "tok-1")]
            (started,) = await collect(client.send_message(send("/sleep 2\nlater", now=True)))
            slow = started.task
            made = await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=slow.id, id="hook-2", url=receiver.url)
            )
            assert (made.id, made.task_id) == ("hook-2", slow.id)
            got = await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=slow.id, id="hook-2")
            )
            assert got.url == receiver.url
            # SubscribeToTask on the api running it follows it to its end.
            streamer = await a2a_client(f"{api_url}/a2a/main", hc, streaming=True)
            events = await collect(streamer.subscribe(SubscribeToTaskRequest(id=slow.id)))
            assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
            await streamer.close()
            receiver.wait_for(slow.id, "TASK_STATE_COMPLETED")
            await client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=slow.id, id="hook-2")
            )
            left = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=slow.id)
            )
            assert list(left.configs) == []
            await client.close()

    run_asyncio(scenario())


def test_scoped_token_talks_only_to_its_agent(
    worker: Any, api_url: str, services: Services
) -> None:
    """A token scoped to agent ops gets ops' card and tasks; main's endpoint and card are
    403; its calls are audited under the `a2a` surface."""
    token = services.store.tokens.create("ops").token

    async def scenario() -> None:
        async with http(token) as hc:
            card = await hc.get(f"{api_url}/a2a/main/.well-known/agent-card.json")
            assert card.status_code == 403
            assert (await hc.get(f"{api_url}/.well-known/agent-card.json")).status_code == 403
            refused = await hc.post(
                f"{api_url}/a2a/main",
                json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}},
                headers={"A2A-Version": "1.0"},
            )
            assert refused.status_code == 403
            client = await a2a_client(f"{api_url}/a2a/ops", hc, streaming=False)
            private = send("/sleep 1\nprivate hook", now=True)
            private.configuration.task_push_notification_config.CopyFrom(
                TaskPushNotificationConfig(url="http://127.0.0.1:9/hook")
            )
            with pytest.raises(InvalidParamsError):  # a scoped token pushes to public URLs only
                await collect(client.send_message(private))
            (first,) = await collect(client.send_message(send("scoped hello")))
            assert first.task.status.state == TaskState.TASK_STATE_COMPLETED
            assert reply_of(first.task) == "scoped hello"
            await client.close()

    run_asyncio(scenario())
    entries = services.store.audit.recent(20)
    assert entries and {e.surface for e in entries} == {"a2a"}
    assert {e.outcome for e in entries} == {"refused", "ok"}  # JSON-RPC errors answer 200
    assert services.store.a2a_tasks.for_agent("ops")[0].state == "TASK_STATE_COMPLETED"


def test_push_configs_belong_to_the_token_that_set_them(
    worker: Any, api_url: str, receiver: Receiver, services: Services
) -> None:
    """Another token on the same task and config id neither overwrites, reads nor deletes
    the owner's push config; the owner's is still the one the task is pushed to."""
    first, second = (services.store.tokens.create("main").token for _ in range(2))
    public = "https://8.8.8.8/elsewhere"  # a public address: a scoped token may name it
    tasks: list[str] = []

    async def scenario() -> None:
        async with http() as owner_hc, http(first) as first_hc, http(second) as second_hc:
            owner = await a2a_client(f"{api_url}/a2a/main", owner_hc, streaming=False)
            (done,) = await collect(owner.send_message(send("owned hook")))
            task_id = done.task.id
            tasks.append(task_id)
            mine = TaskPushNotificationConfig(task_id=task_id, id="hook", url=receiver.url)
            await owner.create_task_push_notification_config(mine)
            intruder = await a2a_client(f"{api_url}/a2a/main", first_hc, streaming=False)
            made = await intruder.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, id="hook", url=public)
            )
            assert made.url == public
            got = await owner.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task_id, id="hook")
            )
            assert got.url == receiver.url, "not overwritten"
            listed = await intruder.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id)
            )
            assert [c.url for c in listed.configs] == [public], "reads only its own"
            await intruder.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="hook")
            )
            other = await a2a_client(f"{api_url}/a2a/main", second_hc, streaming=False)
            with pytest.raises(Exception) as refused:
                await other.get_task_push_notification_config(
                    GetTaskPushNotificationConfigRequest(task_id=task_id, id="hook")
                )
            assert receiver.url not in str(refused.value)
            await other.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="hook")
            )
            kept = await owner.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id)
            )
            assert [c.url for c in kept.configs] == [receiver.url], "not deleted"
            for client in (owner, intruder, other):
                await client.close()

    run_asyncio(scenario())
    stored = services.store.a2a_tasks.push_configs(tasks[0])
    assert [owner for owner, _ in stored] == ["owner"]


@pytest.mark.parametrize("stop", ["terminate", "kill"])
def test_resubscribe_after_api_restart(
    stop: str,
    worker: Any,
    receiver: Receiver,
    switchboard_procs: Any,
    tmp_path: Path,
    config_data: dict[str, Any],
    services: Services,
) -> None:
    """A task outlives its api: after a restart (graceful or not), SubscribeToTask follows
    it to its end, ListTasks and GetTask see it, CancelTask stops another one's run."""
    config_file = tmp_path / "switchboard.json"
    config_file.write_text(json.dumps(config_data), encoding="utf-8")
    switchboard_procs.env["SWITCHBOARD_CONFIG"] = str(config_file)
    switchboard_procs.env["SWITCHBOARD_TOKEN"] = TOKEN
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def start_api() -> Any:
        proc = switchboard_procs("api", "--host", "127.0.0.1", "--port", str(port))
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    return proc
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "api exited"
            assert time.monotonic() < deadline, "api did not start"
            time.sleep(0.1)

    api = start_api()

    async def send_slow() -> tuple[Task, Task]:
        async with http() as hc:
            client = await a2a_client(f"{url}/a2a/main", hc, streaming=False)
            request = send("/sleep 15\nsurvivor", now=True)
            request.configuration.task_push_notification_config.CopyFrom(
                TaskPushNotificationConfig(url=receiver.url)
            )
            (started,) = await collect(client.send_message(request))
            (other,) = await collect(client.send_message(send("/sleep 40\ndoomed", now=True)))
            await client.close()
            return started.task, other.task

    slow, doomed = run_asyncio(send_slow())
    rec = services.store.a2a_tasks.get(slow.id)
    assert rec is not None and rec.run_id is not None
    getattr(api, stop)()  # SIGTERM: stopped as for a restart; SIGKILL: gone without a word
    api.wait(10)
    api = start_api()

    async def follow() -> tuple[list[StreamResponse], Task, Any]:
        async with http() as hc:
            client = await a2a_client(f"{url}/a2a/main", hc, streaming=True)
            # A task started by the api that went away is cancelled by the new one.
            cancelled = await client.cancel_task(CancelTaskRequest(id=doomed.id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            events = await collect(client.subscribe(SubscribeToTaskRequest(id=slow.id)))
            task = await client.get_task(GetTaskRequest(id=slow.id))
            listed = await client.list_tasks(ListTasksRequest(include_artifacts=True))
            await client.close()
            return events, task, listed

    events, task, listed = run_asyncio(follow())
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task" and kinds[-1] == "status_update", kinds
    assert events[0].task.status.state == TaskState.TASK_STATE_WORKING
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    artifacts = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert [get_artifact_text(a) for a in artifacts] == ["survivor"]
    assert task.status.state == TaskState.TASK_STATE_COMPLETED and reply_of(task) == "survivor"
    assert {t.id for t in listed.tasks} == {slow.id, doomed.id}
    doomed_rec = services.store.a2a_tasks.get(doomed.id)
    assert doomed_rec is not None and doomed_rec.run_id is not None
    doomed_run = services.store.runs.get(doomed_rec.run_id)
    assert doomed_run is not None and doomed_run.status == "cancelled"
    run = services.store.runs.get(rec.run_id)
    assert run is not None and run.status == "ok"
    # The api that closed the task from its run pushed its end.
    receiver.wait_for(slow.id, "TASK_STATE_COMPLETED")


def test_a2a_0_3_clients_on_the_same_endpoint(worker: Any, api_url: str) -> None:
    """A 0.3 client (no A2A-Version header, `message/send`, kind-tagged parts) is served on
    the agent's endpoint beside 1.0, through a2a-sdk's compatibility mode: raw JSON-RPC and
    the SDK's own 0.3 transport; the card advertises both versions."""
    from a2a.compat.v0_3.jsonrpc_transport import CompatJsonRpcTransport
    from a2a.types.a2a_pb2 import AgentCard

    async def scenario() -> None:
        async with http() as hc:
            card = (await hc.get(f"{api_url}/a2a/main/.well-known/agent-card.json")).json()
            versions = [i["protocolVersion"] for i in card["supportedInterfaces"]]
            assert versions == ["1.0", "0.3"]
            # What a 0.3 client reads from the card: its top-level url and version.
            assert (card["url"], card["protocolVersion"]) == (f"{api_url}/a2a/main", "0.3")
            assert card["preferredTransport"] == "JSONRPC"

            body = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "message/send",
                "params": {
                    "message": {
                        "kind": "message",
                        "messageId": "m-legacy-1",
                        "role": "user",
                        "parts": [{"kind": "text", "text": "hello from 0.3"}],
                    }
                },
            }
            resp = await hc.post(f"{api_url}/a2a/main", json=body)
            assert resp.status_code == 200, resp.text
            result = resp.json()["result"]
            assert result["kind"] == "task" and result["status"]["state"] == "completed"
            parts = [p for a in result["artifacts"] for p in a["parts"]]
            assert parts == [{"kind": "text", "text": "hello from 0.3"}]

            legacy = CompatJsonRpcTransport(hc, AgentCard(), f"{api_url}/a2a/main")
            answer = await legacy.send_message(send("hello through the 0.3 transport"))
            assert answer.task.status.state == TaskState.TASK_STATE_COMPLETED
            assert reply_of(answer.task) == "hello through the 0.3 transport"

            # A 1.0 client on the same endpoint is unchanged.
            client = await a2a_client(f"{api_url}/a2a/main", hc, streaming=False)
            (first,) = await collect(client.send_message(send("hello from 1.0")))
            assert reply_of(first.task) == "hello from 1.0"

    run_asyncio(scenario())
