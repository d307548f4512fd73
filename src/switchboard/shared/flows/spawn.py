"""Starting sub-agents: the child session, its lineage, its spawn record and its run.

``sessions_spawn`` checks everything first and then calls ``start_child`` (or
``start_batch``) here. The requester's slots are taken before anything is written
(``SpawnRecords.reserve_children``); the spawn record exists before the run is queued, so
the run's ``on_end`` step (``switchboard.subagent_announce``) always finds it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.config import EffectiveSubagents
from switchboard.shared.errors import Conflict, SwitchboardError
from switchboard.shared.flows.spawns import SpawnRecords
from switchboard.shared.flows.subagent import ANNOUNCE_STEP, fail_unstarted
from switchboard.shared.flows.subagent_prompts import (
    ChildBrief,
    child_system_prompt,
    child_task_message,
)
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.policy.tool_policy import subagent_role
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms
from switchboard.shared.tools.registry import ToolContext


@dataclass(frozen=True)
class Requester:
    """The calling session as the server knows it (never from tool arguments)."""

    key: str
    agent_id: str
    channel: str | None
    origin: Mapping[str, str]
    depth: int
    limits: EffectiveSubagents


@dataclass(frozen=True)
class ChildPlan:
    """One child to start, fully checked."""

    task: str
    agent_id: str
    model: str
    label: str | None = None
    thinking: str | None = None
    timeout_s: int = 0
    cleanup: str = "keep"


@dataclass(frozen=True)
class Child:
    """A planned child with its fresh ids: ``agent:<agentId>:subagent:<uuid4>``."""

    plan: ChildPlan
    spawn_id: str
    key: str

    @classmethod
    def for_plan(cls, plan: ChildPlan) -> Child:
        """A child with a new spawn id and session key."""
        return cls(plan, str(uuid.uuid4()), sk.subagent_key(plan.agent_id))


def requester_for(ctx: ToolContext) -> Requester:
    """The requester of a tool call: key, depth, channel and chat route."""
    entry = ctx.services.store.sessions.get(ctx.session_key)
    depth = ctx.spawn_depth or int((entry.get("spawnDepth") if entry else 0) or 0)
    if depth < 1 and sk.is_subagent_key(ctx.session_key):
        depth = max(1, ctx.session_key.count(":subagent:"))
    delivery = (entry.get("deliveryContext") if entry else None) or {}
    channel = (ctx.channel or delivery.get("channel") or "").strip().lower() or None
    return Requester(
        key=ctx.session_key,
        agent_id=ctx.agent_id,
        channel=channel,
        origin=_origin(delivery, channel),
        depth=depth,
        limits=ctx.services.config.subagents_for(ctx.agent_id),
    )


def _origin(delivery: Mapping[str, Any], channel: str | None) -> dict[str, str]:
    """Where the requester talks: its recorded route, else just its current channel."""
    names = ("channel", "to", "accountId", "threadId")
    route = {name: str(delivery[name]) for name in names if delivery.get(name)}
    if route.get("channel") and route.get("to"):
        return route
    return {"channel": channel} if channel else {}


def live_children(svc: Services, records: SpawnRecords, requester: str) -> int:
    """Active children, dropping any whose session no longer exists (deleted by hand)."""
    members = records.active_children(requester)
    entries = svc.store.sessions.get_many(members) if members else []
    for member, entry in zip(members, entries, strict=True):
        if entry is None:
            records.release_child(requester, member)
    return sum(entry is not None for entry in entries)


def start_child(
    svc: Services,
    records: SpawnRecords,
    req: Requester,
    child: Child,
    *,
    mode: str,
    batch: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """Record the spawn, create the child session and queue its run (slots reserved)."""
    plan = child.plan
    depth = req.depth + 1
    role = subagent_role(depth, req.limits.max_spawn_depth)
    records.create(child.spawn_id, _spawn_fields(req, child, mode, depth, batch))
    _create_child_session(svc, req, child, depth, role)
    brief = ChildBrief(
        task=plan.task,
        child_key=child.key,
        requester_key=req.key,
        requester_channel=req.channel,
        depth=depth,
        max_depth=req.limits.max_spawn_depth,
        label=plan.label,
        persistent=mode == "session",
    )
    started = start_run(
        svc,
        RunRequest(
            session_key=child.key,
            message=child_task_message(brief),
            channel=req.channel,
            extra_system_prompt=child_system_prompt(brief),
            provenance={
                "kind": "inter_session",
                "sourceSessionKey": req.key,
                "sourceChannel": req.channel or "internal",
                "sourceTool": "sessions_spawn",
            },
            timeout_s=plan.timeout_s or None,
            model=plan.model,
            kind="subagent",
            meta={"spawnId": child.spawn_id, **({"batchId": batch[0]} if batch else {})},
            on_end={"task": ANNOUNCE_STEP, "args": [child.spawn_id]},
        ),
    )
    records.update(child.spawn_id, {"runId": started["runId"], "status": "running"})
    return {"runId": started["runId"], "childSessionKey": child.key}


def start_batch(
    svc: Services,
    records: SpawnRecords,
    req: Requester,
    children: Sequence[Child],
    *,
    mode: str,
    join: str,
) -> tuple[str, list[dict[str, Any]]]:
    """Record a batch and start every member; returns the batch id and each member's ids."""
    batch_id = str(uuid.uuid4())
    records.create_batch(
        batch_id,
        {
            "batchId": batch_id,
            "requesterKey": req.key,
            "join": join,
            "expected": len(children),
            "spawnIds": [c.spawn_id for c in children],
            "createdAt": now_ms(),
        },
    )
    runs = []
    for index, child in enumerate(children):
        try:
            run = start_child(svc, records, req, child, mode=mode, batch=(batch_id, index))
        except SwitchboardError as exc:
            # The member ends as an error at once, so the batch still completes.
            fail_unstarted(svc, child.spawn_id, exc.message)
            run = {"status": "error", "error": exc.message, "childSessionKey": child.key}
        if child.plan.label:
            run["label"] = child.plan.label
        runs.append(run)
    return batch_id, runs


def abandon(svc: Services, records: SpawnRecords, req: Requester, child: Child) -> None:
    """Undo a spawn whose run could not be started."""
    svc.store.sessions.delete(child.key)
    records.release_child(req.key, child.key)
    records.delete(child.spawn_id)


def _spawn_fields(
    req: Requester, child: Child, mode: str, depth: int, batch: tuple[str, int] | None
) -> dict[str, Any]:
    plan = child.plan
    fields: dict[str, Any] = {
        "spawnId": child.spawn_id,
        "childKey": child.key,
        "requesterKey": req.key,
        "requesterChannel": req.channel,
        "requesterOrigin": dict(req.origin) or None,
        "agentId": plan.agent_id,
        "task": plan.task,
        "label": plan.label,
        "cleanup": plan.cleanup,
        "mode": mode,
        "model": plan.model,
        "runTimeoutSeconds": plan.timeout_s,
        "depth": depth,
        "createdAt": now_ms(),
        "status": "starting",
    }
    if batch is not None:
        fields["batchId"], fields["batchIndex"] = batch
    return fields


def _create_child_session(
    svc: Services, req: Requester, child: Child, depth: int, role: str
) -> None:
    plan = child.plan
    provider, _, model_name = plan.model.partition("/")
    fields: dict[str, Any] = {
        "chatType": sk.chat_type(child.key),
        "spawnedBy": req.key,
        "spawnDepth": depth,
        "subagentRole": role,
        "subagentControlScope": "children" if role == "orchestrator" else "none",
        "spawnId": child.spawn_id,
        "model": model_name,
        "modelProvider": provider,
        "deliver": False,
        "thinkingLevel": plan.thinking,
        "channel": req.channel,
    }
    on_create = {k: v for k, v in fields.items() if v is not None}
    svc.store.sessions.ensure(child.key, on_create=on_create)
    svc.store.sessions.add_child(req.key, child.key)
    if plan.label and svc.store.sessions.key_for_label(plan.label) is None:
        # Labels are unique: one taken meanwhile stays on the spawn record only.
        with contextlib.suppress(Conflict):
            svc.store.sessions.patch(child.key, {"label": plan.label})
