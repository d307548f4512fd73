"""Starting sub-agents: the child session, its lineage, its spawn record and its run.

``sessions_spawn`` checks everything first and then calls ``start_child`` (or
``start_batch``) here. The requester's slots are taken before anything is written
(``SpawnStore.reserve_children``); the spawn record exists before the run is queued, so
the run's ``on_end`` step (``switchboard.subagent_announce``) always finds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.config import EffectiveSubagents
from switchboard.shared.flows import collect
from switchboard.shared.flows.collect import CollectPlan
from switchboard.shared.flows.subagent import ANNOUNCE_STEP, fail_unstarted
from switchboard.shared.flows.subagent_prompts import (
    ChildBrief,
    child_system_prompt,
    child_task_message,
)
from switchboard.shared.gateway.agent import SendBlocked
from switchboard.shared.policy.send_policy import SEND_BLOCKED, resolve_send_policy
from switchboard.shared.policy.tool_policy import subagent_role
from switchboard.shared.queue import enqueue_recorded
from switchboard.shared.runtime.attachments import Attachment
from switchboard.shared.services import Services, ToolContext
from switchboard.shared.store import Pipeline
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.runs import NewRun, now_ms
from switchboard.shared.store.spawns import SpawnStore

# Children written per pipelined round trip (a batch of 1,000 takes ten).
_CHUNK = 100
# `context: "fork"` copies at most this many of the requester's latest transcript messages
# into the child's transcript (a run sees at most its last 200, `executor.HISTORY_LIMIT`).
FORK_MESSAGE_LIMIT = 100
# A batch's children are listed in their order: each one's lineage score (spawn time, ms)
# is this much above the previous one's (exact in a double at today's epoch ms).
_ORDER_STEP_MS = 1 / 1024


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
    # Set for a collector child (`collect: true`): no announce, collected by agents_wait.
    collect: CollectPlan | None = None
    # OpenClaw's newer spawn parameters (`sessions_spawn`): a stable alias, `isolated` or
    # `fork` (the child starts from a copy of the requester's transcript), False for no
    # completion announce, "parent" for the result as a private turn of the requester,
    # and inline attachments for the child's model (never in a transcript).
    task_name: str | None = None
    context: str = "isolated"
    expects_completion: bool = True
    completion_target: str | None = None
    attachments: tuple[Attachment, ...] = ()


@dataclass(frozen=True)
class Child:
    """A planned child with its fresh ids: ``agent:<agentId>:subagent:<uuid4>``, or, under
    a sub-agent of the same agent, that requester's key plus ``:subagent:<uuid4>`` (nested
    keys repeat the suffix, as OpenClaw's do)."""

    plan: ChildPlan
    spawn_id: str
    key: str

    @classmethod
    def for_plan(cls, plan: ChildPlan, requester: str, ks: Keyspace) -> Child:
        """A child of ``requester`` with a new spawn id and session key (nested under a
        sub-agent requester), both made in the requester's slot group: a spawn, its
        child's session and its announce share one slot (`store.slot_groups`)."""
        key = sk.subagent_key(plan.agent_id, ks.new_id_beside(requester))
        if sk.is_subagent_key(requester) and sk.agent_id_of(requester) == sk.agent_id_of(key):
            key = f"{requester}:{sk.strip_agent_prefix(key)}"
        return cls(plan, ks.new_id_beside(requester), key)


@dataclass(frozen=True)
class _Start:
    """One child ready to write: its spawn record, session entry and run."""

    child: Child
    spawn: dict[str, Any]
    session: dict[str, Any]
    run: NewRun
    # False when the new session's send policy denies starting a run in it.
    allowed: bool


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


def live_children(svc: Services, records: SpawnStore, requester: str) -> int:
    """Active children, dropping any whose session no longer exists (deleted by hand)."""
    members = records.active_children(requester)
    entries = svc.store.sessions.get_many(members) if members else []
    for member, entry in zip(members, entries, strict=True):
        if entry is None:
            records.release_child(requester, member)
    return sum(entry is not None for entry in entries)


def start_child(
    svc: Services,
    records: SpawnStore,
    req: Requester,
    child: Child,
    *,
    mode: str,
) -> dict[str, Any]:
    """Record the spawn, create the child session and queue its run (slots reserved)."""
    start = _prepare(svc, req, child, mode, None)
    if not start.allowed:
        raise SendBlocked(SEND_BLOCKED, field="sessionKey")
    recorded = _record(svc, records, req, [start], [now_ms()])
    enqueue_recorded(lambda: svc.queue.enqueue_runs(recorded), len(recorded))
    return {"runId": start.run.run_id, "childSessionKey": child.key}


def start_batch(
    svc: Services,
    records: SpawnStore,
    req: Requester,
    children: Sequence[Child],
    *,
    mode: str,
    join: str,
) -> tuple[str, list[dict[str, Any]]]:
    """Record a batch and start every member; returns the batch id and each member's ids.

    Members are written ``_CHUNK`` at a time, one pipelined round trip each, and each
    chunk's runs are queued over one broker connection before the next chunk is written."""
    batch_id = svc.store.ks.new_id_beside(req.key)
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
    starts = [
        _prepare(svc, req, child, mode, (batch_id, index)) for index, child in enumerate(children)
    ]
    allowed = [s for s in starts if s.allowed]
    base = now_ms()
    scores = [base + index * _ORDER_STEP_MS for index in range(len(allowed))]
    queued = True  # once the broker refused a chunk, the rest are left to the sweep too
    for first in range(0, len(allowed), _CHUNK):
        chunk = slice(first, first + _CHUNK)
        recorded = _record(svc, records, req, allowed[chunk], scores[chunk])
        if queued:
            queued = enqueue_recorded(lambda: svc.queue.enqueue_runs(recorded), len(recorded))  # noqa: B023
    runs = []
    for start in starts:
        key = start.child.key
        run: dict[str, Any] = {"runId": start.run.run_id, "childSessionKey": key}
        if not start.allowed:
            # The member ends as an error at once, so the batch still completes.
            records.create(start.child.spawn_id, start.spawn)
            fail_unstarted(svc, start.child.spawn_id, SEND_BLOCKED)
            run = {"status": "error", "error": SEND_BLOCKED, "childSessionKey": key}
        if start.child.plan.label:
            run["label"] = start.child.plan.label
        runs.append(run)
    return batch_id, runs


def abandon(svc: Services, records: SpawnStore, req: Requester, child: Child) -> None:
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
        "collect": True if plan.collect is not None else None,
        "createdAt": now_ms(),
        "status": "starting",
        "taskName": plan.task_name,
        "context": plan.context if plan.context != "isolated" else None,
        "expectsCompletionMessage": None if plan.expects_completion else False,
        "completionTarget": plan.completion_target,
        "attachments": len(plan.attachments) or None,
    }
    if batch is not None:
        fields["batchId"], fields["batchIndex"] = batch
    return fields


def _session_fields(req: Requester, child: Child, depth: int, role: str) -> dict[str, Any]:
    """The child session entry's fields at creation."""
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
        "taskName": plan.task_name,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _prepare(
    svc: Services, req: Requester, child: Child, mode: str, batch: tuple[str, int] | None
) -> _Start:
    """Everything one child's start writes, decided before anything is written."""
    plan = child.plan
    depth = req.depth + 1
    role = subagent_role(depth, req.limits.max_spawn_depth)
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
    message = {
        "role": "user",
        "content": child_task_message(brief).strip(),
        "timestamp": now_ms(),
        "provenance": {
            "kind": "inter_session",
            "sourceSessionKey": req.key,
            "sourceChannel": req.channel or "internal",
            "sourceTool": "sessions_spawn",
        },
    }
    # Runs are capped at an hour, as every run is (gateway.agent.start_run).
    timeout_s = min(float(plan.timeout_s), 3600.0) if plan.timeout_s > 0 else None
    run = NewRun(
        run_id=svc.store.ks.new_id_beside(child.key),
        session_key=child.key,
        message=message,
        timeout_s=timeout_s or float(svc.config.runs.timeout_seconds),
        extra_system_prompt=child_system_prompt(brief)
        + (f"\n\n{collect.child_prompt(plan.collect)}" if plan.collect is not None else ""),
        model=plan.model,
        channel=req.channel,
        kind="subagent",
        meta={
            "spawnId": child.spawn_id,
            **({"batchId": batch[0]} if batch else {}),
            **({"label": plan.label} if plan.label else {}),
        },
        on_end={"task": ANNOUNCE_STEP, "args": [child.spawn_id]},
        attachments=[a.to_json() for a in plan.attachments],
    )
    session = _session_fields(req, child, depth, role)
    # The child session is new: its send policy follows from the fields it starts with.
    policy = resolve_send_policy(svc.config, session_key=child.key, entry=session)
    spawn = _spawn_fields(req, child, mode, depth, batch)
    if policy != "deny":
        spawn.update(runId=run.run_id, status="running")
    return _Start(child=child, spawn=spawn, session=session, run=run, allowed=policy != "deny")


def _record(
    svc: Services,
    records: SpawnStore,
    req: Requester,
    starts: Sequence[_Start],
    scores: Sequence[float],
) -> list[tuple[str, str]]:
    """Write the children in one round trip; returns the (run, session) pairs to queue.

    Per child, in order: the spawn record (already naming its run, so the announce step
    always finds it), then the session and the run in one step (``RunStore.start``'s
    script: the session is created, the run recorded and the lane taken atomically), then
    the label in the label index (kept only while no other session holds it, and written
    on the session in a second round trip once taken); then the requester's lineage
    (``scores``: each child's place among the requester's children); then, for a
    ``fork``, the copy of the requester's latest messages into the new transcript (the
    run's own message is appended after them when it is claimed)."""
    runs = svc.store.runs
    now = now_ms()
    pipe = svc.store.pipeline()
    for start in starts:
        records.create(start.child.spawn_id, start.spawn, client=pipe)
    first = len(pipe)  # where the runs' starts are among the pipeline's replies
    for start in starts:
        runs.start_in(pipe, start.run, on_create=start.session, now=now)
    labelled = [s for s in starts if s.child.plan.label]
    claims = len(pipe)  # where the label claims are among the replies
    for start in labelled:
        records.claim_label(str(start.child.plan.label), start.child.key, client=pipe)
    lineage = {s.child.key: score for s, score in zip(starts, scores, strict=True)}
    records.add_lineage(req.key, lineage, client=pipe)
    for start in starts:  # a collector's record, which agents_wait finds by its run id
        if start.child.plan.collect is not None:
            _create_collector(svc, req, start, now, pipe)
    for start in starts:  # after the session's creation, before its run's first message
        if start.child.plan.context == "fork":
            forked = start.child.key
            svc.store.transcripts.fork(req.key, forked, FORK_MESSAGE_LIMIT, now, client=pipe)
    done = pipe.execute()
    taken = done[claims : claims + len(labelled)]
    won = {s.child.key: str(s.child.plan.label) for s, t in zip(labelled, taken, strict=True) if t}
    if won:
        records.label_taken(won)
    replies = done[first : first + len(starts)]
    return [
        (s.run.run_id, s.child.key)
        for s, reply in zip(starts, replies, strict=True)
        if as_text(reply[2]) == "lane"
    ]


def _create_collector(
    svc: Services, req: Requester, start: _Start, now: int, pipe: Pipeline
) -> None:
    """Queue a collector child's record on ``pipe`` (its completion is written there)."""
    child = start.child
    assert child.plan.collect is not None
    fields = collect.record_fields(
        child.spawn_id,
        start.run.run_id,
        req.key,
        child.key,
        child.plan.label,
        child.plan.collect,
        now,
    )
    svc.store.collect.create(start.run.run_id, fields, client=pipe)
