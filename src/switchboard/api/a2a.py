"""A2A (protocol 1.0, and 0.3 on the same endpoint, JSON-RPC binding): every configured
agent is an A2A agent.

Served with the official `a2a-sdk`: its JSON-RPC dispatcher and agent-card routes, its
`DefaultRequestHandler` (SendMessage blocking and not, SendStreamingMessage, GetTask,
ListTasks, CancelTask, SubscribeToTask), its `TaskUpdater`. What is ours is the mapping:

- agent ``<id>`` answers at ``/a2a/<id>`` with its card at
  ``/a2a/<id>/.well-known/agent-card.json``; the server's card
  (``/.well-known/agent-card.json``) is the default agent's. Cards and calls need the api's
  bearer token (the card says so: an HTTP bearer security scheme).
- a `contextId` is a session of the agent: ``agent:<id>:a2a:<contextId>``, or the session
  it names when it is a session key of that agent (``agent:<id>:…``); the SDK makes a new
  one when a message has none.
- a Task is one run (`start_run`, as `/v1/responses` starts them) with the message marked
  as inter-session input from channel ``a2a`` (the model sees where it came from). Its
  state follows the run: queued/running -> working, ok -> completed (the reply is the
  artifact ``reply``), cancelled -> canceled, error/lost/timeout -> failed, a send refused
  by policy or scope -> rejected.
- tasks live in Redis (`A2ATaskStore`, behind the SDK's `TaskStore`), so an api restart
  loses none: a task whose api went away is brought up to date from its run when read, and
  SubscribeToTask on any api follows the run to its end (`_RunEventStream`, the SDK's
  cross-replica stream, fed from the run instead of from the process that started it).
- CancelTask stops the run (`cancel_run`) on any api.

Push notifications: configs are kept with the task (`RedisPushConfigStore`) and sent by
the SDK's `BasePushNotificationSender` on every task event; a task closed from its run
after its api went away is pushed by the api that closes it (at least once).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from a2a.helpers import (
    get_message_text,
    new_task,
    new_text_artifact,
    new_text_message,
    new_text_part,
)
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.cluster.event_stream import TaskEventStream, VersionedEvent
from a2a.server.cluster.version import TaskVersion
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    add_a2a_routes_to_fastapi,
    create_agent_card_routes,
    create_jsonrpc_routes,
)
from a2a.server.tasks import (
    BasePushNotificationSender,
    InMemoryTaskStore,
    PushNotificationConfigStore,
    PushNotificationSender,
    TaskStore,
    TaskUpdater,
)
from a2a.server.tasks.push_notification_config_store import (
    normalize_push_notification_config,
)
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    HTTPAuthSecurityScheme,
    ListTasksRequest,
    ListTasksResponse,
    SecurityRequirement,
    SecurityScheme,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatusUpdateEvent,
)
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
    PROTOCOL_VERSION_0_3,
    PROTOCOL_VERSION_1_0,
)
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError
from a2a.utils.push_url_validator import validate_push_notification_url
from fastapi import FastAPI
from google.protobuf import json_format
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from switchboard import __version__
from switchboard.api.a2a_errors import without_exception_text
from switchboard.api.errors import error_response
from switchboard.api.openai_compat import WAIT_GRACE_S
from switchboard.api.scopes import OWNER, Principal, ScopeRefused, audit_note, principal_of
from switchboard.shared import keys as sk
from switchboard.shared.config import SwitchboardConfig
from switchboard.shared.errors import SwitchboardError
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.gateway.resolve import key_options
from switchboard.shared.runtime.cancel import cancel_run
from switchboard.shared.services import Services
from switchboard.shared.store.a2a_tasks import A2ATaskRecord
from switchboard.shared.store.runs import RunRecord, now_ms

PATH = "/a2a"
CHANNEL = "a2a"
SESSION_SEGMENT = "a2a"
REPLY_ARTIFACT = "reply"
# How long a cancel waits for the worker executing the run to stop it (it looks once a second).
CANCEL_WAIT_S = 10.0
# A waiter wakes at least this often to re-read a task it follows (a cancel elsewhere).
FOLLOW_POLL_S = 2.0
# A push notification's POST gives up after this long (delivery is best effort).
PUSH_TIMEOUT_S = 10.0
_PLAIN_CONTEXT = re.compile(r"[a-z0-9][a-z0-9_.-]{0,127}")
_PRINCIPAL = "switchboard.principal"
_TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
# The base URL of the request a card is served for (the card names its endpoint by it).
_BASE_URL: contextvars.ContextVar[str] = contextvars.ContextVar("a2a_base_url", default="")


# ---- the mapping ------------------------------------------------------------------------


def session_for_context(svc: Services, agent_id: str, context_id: str) -> str:
    """The session a `contextId` names: a session key of the agent, else
    ``agent:<id>:a2a:<contextId>`` (hashed unless plain lower-case)."""
    parsed = sk.parse_agent_key(context_id)
    if parsed is not None:
        if parsed.agent_id != agent_id:
            raise InvalidParamsError(
                message=f"contextId {context_id!r} is a session of agent "
                f"{parsed.agent_id!r}, not of {agent_id!r}"
            )
        return sk.canonical_key(context_id, agent_id=agent_id, **key_options(svc))
    name = context_id if _PLAIN_CONTEXT.fullmatch(context_id) else _digest(context_id)
    return sk.canonical_key(f"{SESSION_SEGMENT}:{name}", agent_id=agent_id, **key_options(svc))


def _digest(text: str) -> str:
    return "c-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def state_of(run: RunRecord) -> TaskState:
    """The task state of a run's status."""
    if run.status == "ok":
        return TaskState.TASK_STATE_COMPLETED
    if run.status == "cancelled":
        return TaskState.TASK_STATE_CANCELED
    if run.status in ("queued",):
        return TaskState.TASK_STATE_SUBMITTED
    if run.terminal:  # error, lost, timeout
        return TaskState.TASK_STATE_FAILED
    return TaskState.TASK_STATE_WORKING


def _failure_text(run: RunRecord) -> str:
    if run.status == "timeout":
        return f"the agent run timed out: {run.error or 'deadline passed'}"
    if run.status == "cancelled":
        return "the agent run was cancelled"
    return f"the agent run failed: {run.error or 'unknown error'}"


def reply_artifact(run_id: str, text: str) -> Any:
    """The reply of a run as the task's artifact (one text part, a stable id)."""
    return new_text_artifact(name=REPLY_ARTIFACT, text=text, artifact_id=f"reply-{run_id}")


def finished_task(task: Task, run: RunRecord) -> Task:
    """``task`` brought to its ended run's outcome (state, status message, reply)."""
    done = Task()
    done.CopyFrom(task)
    state = state_of(run)
    done.status.state = state
    done.status.timestamp.FromDatetime(datetime.now(UTC))
    if state == TaskState.TASK_STATE_COMPLETED:
        done.status.ClearField("message")
        if not any(a.artifact_id == f"reply-{run.run_id}" for a in done.artifacts):
            done.artifacts.append(reply_artifact(run.run_id, run.reply or ""))
    else:
        done.status.message.CopyFrom(
            new_text_message(_failure_text(run), context_id=task.context_id, task_id=task.id)
        )
    return done


# ---- the SDK's TaskStore, on Redis -------------------------------------------------------


class RedisTaskStore(TaskStore):
    """One agent's A2A tasks in `A2ATaskStore`. A task still open whose run has ended (its
    api went away before it could say so) is brought to the run's outcome when read."""

    def __init__(self, app: FastAPI, agent_id: str) -> None:
        self.app = app
        self.agent_id = agent_id
        # Told of a task this store closes from its run (its api went away meanwhile).
        self.push_sender: PushNotificationSender | None = None

    @property
    def services(self) -> Services:
        svc: Services = self.app.state.services
        return svc

    async def save(self, task: Task, context: ServerCallContext | None = None) -> None:
        """Write the task whole."""
        await run_in_threadpool(
            self.services.store.a2a_tasks.save_task,
            self.agent_id,
            task.id,
            json_format.MessageToJson(task, indent=None),
            TaskState.Name(task.status.state),
            now_ms(),
        )

    async def link_run(self, task_id: str, run_id: str, session_key: str) -> None:
        """Record the run a task maps to."""
        await run_in_threadpool(
            self.services.store.a2a_tasks.link_run, self.agent_id, task_id, run_id, session_key
        )

    async def record(self, task_id: str) -> A2ATaskRecord | None:
        """The agent's record of the task, if it has one."""
        rec = await run_in_threadpool(self.services.store.a2a_tasks.get, task_id)
        return rec if rec is not None and rec.agent_id == self.agent_id else None

    async def get(self, task_id: str, context: ServerCallContext | None = None) -> Task | None:
        """The task as its run stands, or None (unknown, expired, another agent's)."""
        rec = await self.record(task_id)
        if rec is None or rec.task_json is None:
            return None
        return await self.current(rec)

    async def current(self, rec: A2ATaskRecord) -> Task:
        """The stored task, closed from its run if the run ended meanwhile."""
        task = Task()
        json_format.Parse(rec.task_json or "{}", task)
        if task.status.state in _TERMINAL or rec.run_id is None:
            return task
        run: RunRecord | None = await self.app.state.fetch_run(rec.run_id)
        if run is None or not run.terminal:
            return task
        done = finished_task(task, run)
        await self.save(done)
        if self.push_sender is not None:  # the api that would have told is gone
            await self.push_sender.send_notification(done.id, done)
        return done

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """The agent's tasks, filtered, ordered and paged by the SDK's own rules."""
        recs = await run_in_threadpool(self.services.store.a2a_tasks.for_agent, self.agent_id)
        page = InMemoryTaskStore(owner_resolver=lambda _ctx: "", use_copying=False)
        for rec in recs:
            await page.save(await self.current(rec), context)
        return await page.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext | None = None) -> None:
        """Forget the task."""
        await run_in_threadpool(self.services.store.a2a_tasks.delete, self.agent_id, task_id)


# ---- push-notification configs, on Redis --------------------------------------------------


class RedisPushConfigStore(PushNotificationConfigStore):
    """The SDK's push-notification config store, in `A2ATaskStore` beside the task. Each
    config belongs to the token that set it (the owner's, or a scoped one), which has config
    ids of its own: another token can neither overwrite, read nor delete it. A scoped token
    may only name a public http(s) URL (the SDK's `validate_push_notification_url`)."""

    def __init__(self, tasks: RedisTaskStore) -> None:
        self.tasks = tasks

    async def set_info(
        self,
        task_id: str,
        notification_config: TaskPushNotificationConfig,
        context: ServerCallContext,
    ) -> TaskPushNotificationConfig:
        principal = principal_of_context(context)
        config = normalize_push_notification_config(task_id, notification_config)
        if not principal.is_owner and not await validate_push_notification_url(config.url):
            raise InvalidParamsError(
                message="a push notification URL must be a public http(s) address"
            )
        await run_in_threadpool(
            self.tasks.services.store.a2a_tasks.set_push,
            task_id,
            config.id,
            _owner_of(principal),
            json_format.MessageToJson(config, indent=None),
        )
        return config

    async def _configs(
        self, task_id: str, owner: str | None
    ) -> list[tuple[str, TaskPushNotificationConfig]]:
        raw = await run_in_threadpool(
            self.tasks.services.store.a2a_tasks.push_configs, task_id, owner
        )
        out = []
        for who, text in raw:
            config = TaskPushNotificationConfig()
            json_format.Parse(text, config)
            out.append((who, config))
        return out

    async def get_info(
        self, task_id: str, context: ServerCallContext
    ) -> list[TaskPushNotificationConfig]:
        owner = _owner_of(principal_of_context(context))
        return [c for _who, c in await self._configs(task_id, owner)]

    async def get_info_for_dispatch(self, task_id: str) -> list[TaskPushNotificationConfig]:
        return [c for _who, c in await self._configs(task_id, None)]

    async def delete_info(
        self, task_id: str, context: ServerCallContext, config_id: str | None = None
    ) -> None:
        owner = _owner_of(principal_of_context(context))
        for config in await self.get_info(task_id, context):
            if config_id is None or config.id == config_id:
                await run_in_threadpool(
                    self.tasks.services.store.a2a_tasks.delete_push, task_id, owner, config.id
                )


def _owner_of(principal: Principal) -> str:
    return f"token:{principal.token_id}" if principal.token_id else "owner"


# ---- following a task from its run (any api process) -------------------------------------


class _RunEventStream(TaskEventStream):
    """The SDK's cross-replica event stream, fed from runs: a task started by another api
    process (or by one that restarted) is followed through its run to its end, whose
    outcome (reply artifact, final status) is streamed. Events of a task running here
    reach its subscribers directly, so nothing is published."""

    def __init__(self, tasks: RedisTaskStore) -> None:
        self.tasks = tasks

    async def publish(self, task_id: str, event: VersionedEvent) -> None:
        return None

    async def destroy(self, task_id: str) -> None:
        return None

    async def subscribe(
        self, task_id: str, *, after: TaskVersion
    ) -> AsyncGenerator[VersionedEvent, None]:
        state = self.tasks.app.state
        while True:
            rec = await self.tasks.record(task_id)
            if rec is None or rec.task_json is None:
                return
            task = await self.tasks.current(rec)
            if task.status.state in _TERMINAL:
                break
            if rec.run_id is None:
                await asyncio.sleep(FOLLOW_POLL_S)
            else:
                await state.waiter.wait(rec.run_id, FOLLOW_POLL_S, state.fetch_run)
        for artifact in task.artifacts:
            event = TaskArtifactUpdateEvent(
                task_id=task.id, context_id=task.context_id, artifact=artifact, last_chunk=True
            )
            yield VersionedEvent(event=event, version=TaskVersion.MISSING)
        status = TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id)
        status.status.CopyFrom(task.status)
        yield VersionedEvent(event=status, version=TaskVersion.MISSING)


# ---- the agent executor: a task is a run ------------------------------------------------


class RunExecutor(AgentExecutor):
    """Starts a run for a message (as `/v1/responses` does) and reports its end."""

    def __init__(self, app: FastAPI, agent_id: str, tasks: RedisTaskStore) -> None:
        self.app = app
        self.agent_id = agent_id
        self.tasks = tasks

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = str(context.task_id)
        context_id = str(context.context_id)
        updater = TaskUpdater(event_queue, task_id, context_id)
        svc: Services = self.app.state.services
        principal = principal_of_context(context.call_context)
        text = get_message_text(context.message) if context.message is not None else ""
        if not text.strip():
            await self._open(context, event_queue)
            await updater.reject(self._say(updater, "the message has no text part"))
            return
        try:
            key = await run_in_threadpool(session_for_context, svc, self.agent_id, context_id)
            principal.check_agent(self.agent_id)
            principal.check_may_start_runs()
            principal.check_session(key)
            started = await run_in_threadpool(
                start_run,
                svc,
                RunRequest(
                    session_key=key,
                    message=text,
                    channel=CHANNEL,
                    idempotency_key=f"a2a:{task_id}",
                    provenance={"kind": "inter_session", "sourceChannel": CHANNEL},
                    owner=principal.is_owner,
                ),
            )
        except (SwitchboardError, InvalidParamsError) as exc:
            await self._open(context, event_queue)
            await updater.reject(self._say(updater, _message_of(exc)))
            return
        run_id = started.get("runId")
        if run_id:  # linked before the task is first written: any api can follow it
            await self.tasks.link_run(task_id, str(run_id), key)
        await self._open(context, event_queue)
        if not run_id:  # an owner command (`/send on`), answered without a run
            reply = str(started.get("reply", ""))
            await updater.add_artifact([new_text_part(reply)], name=REPLY_ARTIFACT)
            await updater.complete()
            return
        await updater.start_work()
        run = await self._await_end(str(run_id))
        await self._report(updater, run, str(run_id))

    @staticmethod
    async def _open(context: RequestContext, event_queue: EventQueue) -> None:
        """Enqueue the new task (submitted): the SDK wants it before its updates."""
        if context.current_task is not None:
            return
        history = [context.message] if context.message is not None else []
        task = new_task(
            str(context.task_id),
            str(context.context_id),
            TaskState.TASK_STATE_SUBMITTED,
            history=history,
        )
        await event_queue.enqueue_event(task)

    async def _await_end(self, run_id: str) -> RunRecord | None:
        state = self.app.state
        svc: Services = state.services
        wait_s = float(svc.config.runs.timeout_seconds) + WAIT_GRACE_S
        while True:
            run: RunRecord | None = await state.waiter.wait(run_id, wait_s, state.fetch_run)
            if run is None or run.terminal:
                return run

    async def _report(self, updater: TaskUpdater, run: RunRecord | None, run_id: str) -> None:
        if run is None:
            await updater.failed(self._say(updater, "the run's record is no longer kept"))
            return
        state = state_of(run)
        if state == TaskState.TASK_STATE_COMPLETED:
            await updater.add_artifact(
                [new_text_part(run.reply or "")],
                artifact_id=f"reply-{run_id}",
                name=REPLY_ARTIFACT,
                last_chunk=True,
            )
            await updater.complete()
        elif state == TaskState.TASK_STATE_CANCELED:
            await updater.cancel()
        else:
            await updater.failed(self._say(updater, _failure_text(run)))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Stop the task's run; `execute`, waiting on it, reports the cancel."""
        rec = await self.tasks.record(str(context.task_id))
        if rec is None or rec.run_id is None or rec.session_key is None:
            return  # no run yet: the SDK closes the task as canceled
        await _stop_run(self.app, rec.run_id, rec.session_key)

    @staticmethod
    def _say(updater: TaskUpdater, text: str) -> Any:
        return updater.new_agent_message([new_text_part(text)])


async def _stop_run(app: FastAPI, run_id: str, session_key: str) -> None:
    """Cancel a run and wait (a while) for it to end."""
    svc: Services = app.state.services
    res = await run_in_threadpool(cancel_run, svc, run_id, session_key)
    if res.verdict == "requested":  # its worker stops it within a second
        await app.state.waiter.wait(run_id, CANCEL_WAIT_S, app.state.fetch_run)


def _message_of(exc: Exception) -> str:
    if isinstance(exc, SwitchboardError):
        return exc.message
    return str(getattr(exc, "message", None) or exc)


class _Handler(DefaultRequestHandler):
    """The SDK's handler; CancelTask stops the task's run on whichever api it is asked."""

    def __init__(self, tasks: RedisTaskStore, **kwargs: Any) -> None:
        super().__init__(task_store=tasks, **kwargs)
        self.tasks = tasks

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        rec = await self.tasks.record(params.id)
        if rec is not None and rec.run_id is not None and rec.session_key is not None:
            task = await self.tasks.get(params.id)
            if task is not None and task.status.state not in _TERMINAL:
                await _stop_run(self.tasks.app, rec.run_id, rec.session_key)
        try:
            cancelled: Task | None = await super().on_cancel_task(params, context)
            return cancelled
        except TaskNotCancelableError:
            task = await self.tasks.get(params.id)
            if task is not None and task.status.state == TaskState.TASK_STATE_CANCELED:
                return task  # cancelled by this request, reported by the run's end
            raise


# ---- who is asking ----------------------------------------------------------------------


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context, carrying the request's principal (owner or scoped token)."""

    def build(self, request: Request) -> ServerCallContext:
        ctx = super().build(request)
        headers = ctx.state.get("headers") or {}
        # The SDK reads the headers (A2A-Version); the bearer token is not kept with the call.
        ctx.state["headers"] = {k: v for k, v in headers.items() if k != "authorization"}
        ctx.state[_PRINCIPAL] = principal_of(request)
        return ctx


def principal_of_context(ctx: ServerCallContext) -> Principal:
    """The principal a call context carries (the owner when none)."""
    principal = ctx.state.get(_PRINCIPAL)
    return principal if isinstance(principal, Principal) else OWNER


def _agent_checked(
    agent_id: str, endpoint: Callable[[Request], Awaitable[Response]]
) -> Callable[[Request], Awaitable[Response]]:
    """``endpoint`` for a caller that may act as ``agent_id`` (a scoped token: 403 else)."""

    async def checked(request: Request) -> Response:
        note = audit_note(request)
        if note is not None:
            note.tool = f"a2a/{agent_id}"
        try:
            principal_of(request).check_agent(agent_id)
        except ScopeRefused as exc:
            return error_response(403, exc.kind, exc.message)
        _BASE_URL.set(str(request.base_url).rstrip("/"))
        return without_exception_text(await endpoint(request))

    return checked


# ---- cards and routes -------------------------------------------------------------------


def agent_card(config: SwitchboardConfig, agent_id: str, base_url: str = "") -> AgentCard:
    """The agent's card: its name and skill from the config, its endpoint, bearer auth."""
    entry = config.agent(agent_id)
    name = (entry.name if entry is not None else None) or agent_id
    description = f"Switchboard agent {agent_id!r}: a session-based AI agent."
    return AgentCard(
        name=name,
        description=description,
        version=__version__,
        # 1.0 first (what current clients pick), then 0.3 on the same endpoint: a2a-sdk's
        # compatibility mode answers 0.3 clients there (`message/send`, kind-tagged parts),
        # and the 0.3 interface gives the card the fields they read (url, protocolVersion).
        supported_interfaces=[
            AgentInterface(
                url=f"{base_url}{PATH}/{agent_id}",
                protocol_binding="JSONRPC",
                protocol_version=version,
            )
            for version in (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3)
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=True),
        security_schemes={
            "bearer": SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    description="The api token (SWITCHBOARD_TOKEN) or a scoped token "
                    "of this agent.",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={"bearer": _empty_scopes()})],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id=agent_id,
                name=name,
                description=f"Talk to agent {agent_id!r}: each contextId is one of its "
                "sessions, each task one run.",
                tags=["chat", "sessions"],
            )
        ],
    )


def _empty_scopes() -> Any:
    from a2a.types.a2a_pb2 import StringList

    return StringList()


def _with_base_url(
    config: SwitchboardConfig, agent_id: str
) -> Callable[[AgentCard], Awaitable[AgentCard]]:
    async def modify(card: AgentCard) -> AgentCard:
        return agent_card(config, agent_id, _BASE_URL.get())

    return modify


def _checked_routes(agent_id: str, routes: list[Route]) -> list[Route]:
    return [
        Route(r.path, endpoint=_agent_checked(agent_id, r.endpoint), methods=r.methods)
        for r in routes
    ]


def mount_a2a(app: FastAPI, config: SwitchboardConfig) -> None:
    """Add each agent's JSON-RPC endpoint and card, and the server's card (the default
    agent's)."""
    default_agent_id = config.default_agent_id()
    push_client = httpx.AsyncClient(timeout=PUSH_TIMEOUT_S)  # push notifications
    for agent_id in config.agent_ids():
        tasks = RedisTaskStore(app, agent_id)
        pushes = RedisPushConfigStore(tasks)
        tasks.push_sender = BasePushNotificationSender(push_client, pushes)
        card = agent_card(config, agent_id)
        handler = _Handler(
            tasks,
            agent_executor=RunExecutor(app, agent_id, tasks),
            agent_card=card,
            event_stream=_RunEventStream(tasks),
            push_config_store=pushes,
            push_sender=tasks.push_sender,
        )
        base = f"{PATH}/{agent_id}"
        cards = create_agent_card_routes(
            card,
            card_modifier=_with_base_url(config, agent_id),
            card_url=base + AGENT_CARD_WELL_KNOWN_PATH,
        )
        if agent_id == default_agent_id:
            cards += create_agent_card_routes(
                card,
                card_modifier=_with_base_url(config, agent_id),
                card_url=AGENT_CARD_WELL_KNOWN_PATH,
            )
        rpc = create_jsonrpc_routes(
            handler, rpc_url=base, context_builder=_ContextBuilder(), enable_v0_3_compat=True
        )
        add_a2a_routes_to_fastapi(
            app,
            agent_card_routes=_checked_routes(agent_id, cards),
            jsonrpc_routes=_checked_routes(agent_id, rpc),
        )
