"""`sessions_spawn`: start sub-agents in fresh sessions; their results are announced back.

Always non-blocking (SPEC §7): the checks run in OpenClaw's order (reference §7.2) and
nothing is written until every one has passed, then the child session, its lineage and
its spawn record are created and the child run is queued with ``on_end`` =
``switchboard.subagent_announce(spawnId)``. ``tasks: [...]`` (with ``join: each|all``)
spawns a batch the same way: every entry is checked first, then all are started.

OpenClaw's newer parameters: ``taskName`` (a checked alias, kept on the spawn and the child
session), ``context: "fork"`` (`flows.spawn.FORK_MESSAGE_LIMIT`), ``expectsCompletionMessage:
false`` and ``completionTarget: "parent"`` (read by the announce step), ``attachments``
(`runtime.attachments`: for the child's model only) and ``runTimeoutSeconds`` as an
integer >= 0 (0: no per-run timeout; the product's run deadline still applies). As in
OpenClaw 2026.9.6, ``timeoutSeconds`` and the channel-delivery keys are refused first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.config import EffectiveSubagents
from switchboard.shared.errors import InvalidInput, StoreUnavailable, SwitchboardError
from switchboard.shared.flows.collect import CollectPlan
from switchboard.shared.flows.spawn import (
    FORK_MESSAGE_LIMIT,
    Child,
    ChildPlan,
    Requester,
    abandon,
    live_children,
    requester_for,
    start_batch,
    start_child,
)
from switchboard.shared.runtime import attachments as att
from switchboard.shared.runtime.models import validate_model_ref
from switchboard.shared.services import Services
from switchboard.shared.store.spawns import SpawnStore
from switchboard.shared.tools.args import read_bool, read_non_negative_int, read_string
from switchboard.shared.tools.collect_spawn import NOTE as COLLECT_NOTE
from switchboard.shared.tools.collect_spawn import PARAMS as COLLECT_PARAMS
from switchboard.shared.tools.collect_spawn import PROPERTIES as COLLECT_PROPERTIES
from switchboard.shared.tools.collect_spawn import (
    CollectRefused,
    collect_plan,
    release_group,
    reserve_group,
)
from switchboard.shared.tools.registry import ToolContext, ToolSpec

THINKING_LEVELS = ("off", "minimal", "low", "medium", "high", "xhigh")
# Channel-delivery keys this tool refuses (first one found, in this order).
_UNSUPPORTED_KEYS = (
    "target",
    "transport",
    "channel",
    "to",
    "threadId",
    "thread_id",
    "replyTo",
    "reply_to",
)
# Keys a batch entry inherits from the top level when it does not set them.
_INHERITED = (
    "agentId",
    "model",
    "thinking",
    "runTimeoutSeconds",
    "cleanup",
    "context",
    "expectsCompletionMessage",
    "completionTarget",
)
# OpenClaw's taskName: a stable alias; `all` and `last` name other targets.
_TASK_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
_RESERVED_TASK_NAMES = ("all", "last")
_AGENT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$", re.IGNORECASE)
TIMEOUT_SECONDS_REFUSED = (
    'sessions_spawn does not support "timeoutSeconds". Use "runTimeoutSeconds" for a '
    "per-run timeout."
)
_RUN_NOTE = (
    "Auto-announce is push-based. After spawning children, do NOT call sessions_list, "
    "sessions_history, exec sleep, or any polling tool. Wait for completion events to arrive "
    "as user messages, track expected child session keys, and only send your final answer "
    "after ALL expected completions arrive. If a child completion event arrives AFTER your "
    "final answer, reply ONLY with NO_REPLY."
)
_JOIN_ALL_NOTE = " With join=all, one combined announce arrives when every child has ended."

DESCRIPTION = (
    "Spawn a sub-agent in a fresh session (agent:<agentId>:subagent:<uuid>) to work on a "
    "task; context=fork starts it from a copy of this session's transcript. Returns at "
    "once with {status: accepted, runId, childSessionKey}; when the child finishes, its "
    "result is announced back to this session and chat (Status / Result / Notes), or as a "
    'private turn of this session with completionTarget="parent", or not at all with '
    "expectsCompletionMessage=false. Pass `tasks` (a list of {task, label?, agentId?, "
    "model?, ...}) "
    'instead of `task` to fan out several children at once; `join: "all"` gives one '
    "combined announce when all have ended. Use agents_list to see which agentIds you may "
    "use."
)

_ENTRY_PROPERTIES: dict[str, Any] = {
    "task": {"type": "string", "description": "What the sub-agent should do."},
    "label": {"type": "string", "description": "A short name for the child session."},
    "agentId": {"type": "string", "description": "Spawn under another agent (if allowed)."},
    "model": {"type": "string", "description": "Model override, provider/model."},
    "thinking": {"type": "string", "description": "Thinking level override."},
    "taskName": {
        "type": "string",
        "description": "Stable later-target alias; starts lowercase letter; then "
        "lowercase/digit/_/-.",
    },
    "runTimeoutSeconds": {
        "type": "integer",
        "minimum": 0,
        "description": "Abort the child run after N seconds (0 disables the per-run timeout; "
        "the product's run deadline still applies).",
    },
    "cleanup": {"type": "string", "enum": ["delete", "keep"]},
    "context": {
        "type": "string",
        "enum": ["isolated", "fork"],
        "description": "isolated (default) or fork: the child starts from a copy of this "
        f"session's latest {FORK_MESSAGE_LIMIT} transcript messages.",
    },
    "expectsCompletionMessage": {
        "type": "boolean",
        "description": "false: fire-and-forget; no completion announce when the child ends.",
    },
    "completionTarget": {
        "type": "string",
        "enum": ["parent"],
        "description": "parent: the result comes back as a private turn of this session "
        "(a run of it), not delivered to a channel.",
    },
    "attachments": {
        "type": "array",
        "maxItems": att.MAX_FILES,
        "description": "Inline files given to the child's model with its task; never stored "
        "in a transcript.",
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "content": {"type": "string"},
                "encoding": {"type": "string", "enum": ["utf8", "base64"]},
                "mimeType": {"type": "string"},
            },
            "required": ["name", "content"],
        },
    },
}

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        **_ENTRY_PROPERTIES,
        "thread": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["run", "session"]},
        "tasks": {
            "type": "array",
            "description": "Batch fan-out: one entry per child, instead of `task`.",
            "items": {"type": "object", "properties": _ENTRY_PROPERTIES, "required": ["task"]},
        },
        **COLLECT_PROPERTIES,
        "join": {
            "type": "string",
            "enum": ["each", "all"],
            "description": "Batch announces: one per child (each) or one combined (all).",
        },
    },
}


class _Refused(Exception):
    """A contract outcome (`status: error | forbidden`) that ends the call early."""

    def __init__(self, status: str, error: str) -> None:
        super().__init__(error)
        self.result = {"status": status, "error": error}


def sessions_spawn(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The tool handler: check everything, then start one child or a batch."""
    _reject_unsupported_keys(args)
    try:
        if args.get("tasks") is not None:
            return _spawn_batch(ctx, args)
        return _spawn_one(ctx, args)
    except (_Refused, CollectRefused) as refused:
        return refused.result


def _reject_unsupported_keys(args: Mapping[str, Any]) -> None:
    """OpenClaw 2026.9.6 refuses ``timeoutSeconds`` (here or in a batch entry) and the
    channel-delivery keys before anything else."""
    entries = args.get("tasks")
    scopes = (
        [args, *(e for e in entries if isinstance(e, Mapping))]
        if isinstance(entries, list)
        else [args]
    )
    if any(k in scope for scope in scopes for k in ("timeoutSeconds", "timeout_seconds")):
        raise InvalidInput(TIMEOUT_SECONDS_REFUSED, field="timeoutSeconds")
    for key in _UNSUPPORTED_KEYS:
        if key in args:
            raise InvalidInput(
                f'sessions_spawn does not support "{key}"; remove channel-delivery parameters.',
                field=key,
            )


def _spawn_one(ctx: ToolContext, args: Mapping[str, Any]) -> dict[str, Any]:
    task = read_string(args, "task", required=True)
    assert task is not None
    _check_runtime(args)
    _check_agent_id_format(args)
    mode, thread = _mode(args)
    _check_completion_target(args, mode=mode, thread=thread)
    req = requester_for(ctx)
    _check_depth(req)
    records = ctx.services.store.spawns
    collector = collect_plan(ctx.services, args, mode=mode, thread=thread)
    if collector is None:  # collector children do not count towards maxChildrenPerAgent
        _check_capacity(ctx.services, records, req, 1)
    plan = replace(_plan(ctx.services, req, args, task), collect=collector)
    _check_thread(thread)
    child = Child.for_plan(plan, req.key, ctx.services.store.ks)
    _take_slots(ctx.services, records, req, [child], collector)
    try:
        started = start_child(ctx.services, records, req, child, mode=mode)
    except StoreUnavailable:
        raise  # the store is away: retried, not an outcome
    except SwitchboardError as exc:
        abandon(ctx.services, records, req, child)
        if collector is not None:
            release_group(ctx.services, req.key, collector, 1)
        return {"status": "error", "error": exc.message, "childSessionKey": child.key}
    result: dict[str, Any] = {"status": "accepted", **started, "mode": mode}
    result.update(_plan_fields(plan))
    result.update(_note(ctx, mode, join=None))
    if collector is not None:
        result["note"] = COLLECT_NOTE
    result["modelApplied"] = True
    return result


def _plan_fields(plan: ChildPlan) -> dict[str, Any]:
    """What an accepted spawn's result says of the newer parameters (OpenClaw's shape)."""
    out: dict[str, Any] = {"context": plan.context}
    if plan.task_name:
        out["taskName"] = plan.task_name
    if not plan.expects_completion:
        out["expectsCompletionMessage"] = False
    if plan.completion_target:
        out["completionTarget"] = plan.completion_target
    if plan.attachments:
        out["attachments"] = att.receipt(plan.attachments)
    return out


def _spawn_batch(ctx: ToolContext, args: Mapping[str, Any]) -> dict[str, Any]:
    if read_string(args, "task") is not None:
        raise InvalidInput("use either task or tasks, not both", field="tasks")
    entries = _batch_entries(args)
    join = read_string(args, "join") or "each"
    if join not in ("each", "all"):
        raise InvalidInput('join must be "each" or "all"', field="join")
    _check_runtime(args)
    mode, thread = _mode(args)
    if join == "all" and any(e.get("completionTarget") is not None for e in entries):
        raise InvalidInput('completionTarget="parent" is not supported with join="all"')
    req = requester_for(ctx)
    _check_depth(req)
    collector = collect_plan(ctx.services, args, mode=mode, thread=thread)
    plans: list[ChildPlan] = []
    for index, entry in enumerate(entries):
        try:
            _reject_unsupported_keys(entry)
            if any(name in entry for name in COLLECT_PARAMS):
                raise InvalidInput("collect, outputSchema and groupId apply to the whole batch")
            task = read_string(entry, "task", required=True)
            assert task is not None
            _check_agent_id_format(entry)
            _check_completion_target(entry, mode=mode, thread=thread)
            plans.append(replace(_plan(ctx.services, req, entry, task), collect=collector))
        except _Refused as refused:
            raise _Refused(refused.result["status"], f"tasks[{index}]: {refused}") from None
        except InvalidInput as exc:
            raise InvalidInput(f"tasks[{index}]: {exc.message}", field="tasks") from None
    _check_batch_attachments(plans)
    records = ctx.services.store.spawns
    if collector is None:
        _check_capacity(ctx.services, records, req, len(plans))
    _check_thread(thread)
    children = [Child.for_plan(plan, req.key, ctx.services.store.ks) for plan in plans]
    _take_slots(ctx.services, records, req, children, collector)
    batch_id, runs = start_batch(ctx.services, records, req, children, mode=mode, join=join)
    result: dict[str, Any] = {
        "status": "accepted",
        "batchId": batch_id,
        "join": join,
        "runs": runs,
        "mode": mode,
    }
    result.update(_note(ctx, mode, join=join))
    if collector is not None:
        result["note"] = COLLECT_NOTE
    return result


def _batch_entries(args: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = args.get("tasks")
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("tasks must be a non-empty list", field="tasks")
    entries = []
    for index, item in enumerate(raw):
        if isinstance(item, str):
            item = {"task": item}
        if not isinstance(item, dict):
            raise InvalidInput(f"tasks[{index}] must be an object with a task", field="tasks")
        inherited = {k: args[k] for k in _INHERITED if k in args and k not in item}
        entries.append({**inherited, **item})
    return entries


# -- checks, in OpenClaw's order ---------------------------------------------------------


def _check_runtime(args: Mapping[str, Any]) -> None:
    runtime = read_string(args, "runtime")
    if runtime == "acp":
        raise _Refused("error", 'runtime="acp" is unavailable: no ACP backend is configured.')
    for name in ("streamTo", "resumeSessionId"):
        if read_string(args, name):
            raise _Refused(
                "error", f"{name} is only supported for runtime=acp; got runtime=subagent"
            )


def _check_agent_id_format(args: Mapping[str, Any]) -> None:
    agent_id = read_string(args, "agentId")
    if agent_id is not None and not _AGENT_ID.match(agent_id):
        raise _Refused(
            "error",
            f'Invalid agentId "{agent_id}". Agent IDs must match [a-z0-9][a-z0-9_-]{{0,63}}. '
            "Use agents_list to discover valid targets.",
        )


def _mode(args: Mapping[str, Any]) -> tuple[str, bool]:
    thread = read_bool(args, "thread")
    mode = read_string(args, "mode")
    if mode not in ("run", "session"):
        mode = "session" if thread else "run"
    if mode == "session" and not thread:
        raise _Refused(
            "error",
            'mode="session" requires thread=true so the subagent can stay bound to a thread.',
        )
    return mode, thread


def _check_depth(req: Requester) -> None:
    limit = req.limits.max_spawn_depth
    if req.depth >= limit:
        raise _Refused(
            "forbidden",
            f"sessions_spawn is not allowed at this depth (current depth: {req.depth}, "
            f"max: {limit}; agents.defaults.subagents.maxSpawnDepth).",
        )


def _check_capacity(svc: Services, records: SpawnStore, req: Requester, wanted: int) -> None:
    active = live_children(svc, records, req.key)
    limit = req.limits.max_children_per_agent
    if active + wanted > limit:
        raise _Refused("forbidden", _capacity_message(active, limit, wanted))


def _capacity_message(active: int, limit: int, wanted: int) -> str:
    text = (
        f"sessions_spawn has reached max active children for this session ({active}/{limit}; "
        "agents.defaults.subagents.maxChildrenPerAgent)."
    )
    if wanted > 1:
        text += f" A batch of {wanted} needs {active + wanted - limit} more slot(s)."
    return text


def _plan(svc: Services, req: Requester, args: Mapping[str, Any], task: str) -> ChildPlan:
    task_name = _task_name(args)
    requested = read_string(args, "agentId")
    if requested is None and svc.config.subagents_for(req.agent_id).require_agent_id:
        raise _Refused(
            "forbidden",
            "sessions_spawn requires explicit agentId when requireAgentId is configured. "
            "Use agents_list to see allowed agent ids.",
        )
    target = requested.lower() if requested else req.agent_id
    _check_allowed(req, target)
    thinking = _thinking(svc, args, target)
    model = read_string(args, "model") or svc.config.subagent_model_for(target)
    try:
        validate_model_ref(model, svc.config.models.providers)
    except InvalidInput as exc:
        raise _Refused("error", exc.message) from None
    cleanup = "delete" if read_string(args, "cleanup") == "delete" else "keep"
    timeout_s = _run_timeout_s(args, req.limits)
    try:
        attachments = tuple(att.prepare(args.get("attachments")))
    except att.AttachmentError as exc:
        raise _Refused("error", str(exc)) from None
    return ChildPlan(
        task=task,
        label=read_string(args, "label"),
        agent_id=target,
        model=model,
        thinking=thinking,
        timeout_s=timeout_s,
        cleanup=cleanup,
        task_name=task_name,
        context="fork" if read_string(args, "context") == "fork" else "isolated",
        expects_completion=args.get("expectsCompletionMessage") is not False,
        completion_target=read_string(args, "completionTarget"),
        attachments=attachments,
    )


def _task_name(args: Mapping[str, Any]) -> str | None:
    """OpenClaw's taskName check: a stable alias, or an error result naming the value."""
    name = read_string(args, "taskName")
    if name is None:
        return None
    if not _TASK_NAME.match(name):
        raise _Refused(
            "error", f'Invalid taskName "{name}". Use 1-64 chars matching [a-z][a-z0-9_-]*.'
        )
    if name in _RESERVED_TASK_NAMES:
        raise _Refused(
            "error",
            f'Invalid taskName "{name}". Reserved subagent targets cannot be used as '
            "taskName values.",
        )
    return name


def _check_completion_target(args: Mapping[str, Any], *, mode: str, thread: bool) -> None:
    """``completionTarget`` is "parent" or absent, for a one-shot hidden child that
    announces (OpenClaw: not with thread, session mode or expectsCompletionMessage=false)."""
    target = args.get("completionTarget")
    if target is None:
        return
    if target != "parent":
        raise InvalidInput(
            'sessions_spawn completionTarget must be "parent" or omitted.',
            field="completionTarget",
        )
    if thread or mode == "session":
        raise InvalidInput(
            'sessions_spawn completionTarget="parent" requires a hidden native subagent run.',
            field="completionTarget",
        )
    if args.get("expectsCompletionMessage") is False:
        raise InvalidInput(
            'sessions_spawn completionTarget="parent" cannot be combined with '
            "expectsCompletionMessage=false.",
            field="completionTarget",
        )


def _check_batch_attachments(plans: Sequence[ChildPlan]) -> None:
    """A batch's attachments together stay within one spawn's total bytes."""
    total = sum(a.bytes for plan in plans for a in plan.attachments)
    if total > att.MAX_TOTAL_BYTES:
        raise _Refused(
            "error",
            f"attachments_total_bytes_exceeded (totalBytes={total} "
            f"maxTotalBytes={att.MAX_TOTAL_BYTES})",
        )


def _check_allowed(req: Requester, target: str) -> None:
    if target == req.agent_id:
        return
    allowed = req.limits.allow_agents
    if "*" in allowed or target in allowed:
        return
    shown = ", ".join(allowed) if allowed else "none"
    raise _Refused("forbidden", f"agentId is not allowed for sessions_spawn (allowed: {shown})")


def _thinking(svc: Services, args: Mapping[str, Any], target: str) -> str | None:
    value = read_string(args, "thinking") or svc.config.subagents_for(target).thinking
    if value is None:
        return None
    level = value.strip().lower()
    if level not in THINKING_LEVELS:
        raise _Refused(
            "error", f'Invalid thinking level "{value}". Use one of: {", ".join(THINKING_LEVELS)}.'
        )
    return None if level == "off" else level


def _run_timeout_s(args: Mapping[str, Any], limits: EffectiveSubagents) -> int:
    """``runTimeoutSeconds`` (integer >= 0, 0 disables), else the configured default."""
    value = read_non_negative_int(args, "runTimeoutSeconds")
    return limits.run_timeout_seconds if value is None else value


def _check_thread(thread: bool) -> None:
    if thread:
        raise _Refused(
            "error",
            "thread=true is unavailable because no channel plugin registered "
            "subagent_spawning hooks.",
        )


# -- starting ----------------------------------------------------------------------------


def _reserve(records: SpawnStore, req: Requester, children: Sequence[Child]) -> None:
    limit = req.limits.max_children_per_agent
    ok, active = records.reserve_children(req.key, [c.key for c in children], limit)
    if not ok:  # another spawn took the slots since the check
        raise _Refused("forbidden", _capacity_message(active, limit, len(children)))


def _take_slots(
    svc: Services,
    records: SpawnStore,
    req: Requester,
    children: Sequence[Child],
    collector: CollectPlan | None,
) -> None:
    """The requester's active-children slots, or a collector group's."""
    if collector is None:
        _reserve(records, req, children)
    else:
        reserve_group(svc, req.key, collector, len(children))


def _note(ctx: ToolContext, mode: str, *, join: str | None) -> dict[str, str]:
    if mode == "session":
        return {
            "note": "thread-bound session stays active after this task; continue in-thread "
            "for follow-ups."
        }
    opts = {"main_key": ctx.services.config.session.main_key}
    if sk.session_kind(ctx.session_key, **opts) == "cron":
        return {}
    return {"note": _RUN_NOTE + (_JOIN_ALL_NOTE if join == "all" else "")}


SPEC = ToolSpec(
    name="sessions_spawn",
    description=DESCRIPTION,
    parameters=PARAMETERS,
    handler=sessions_spawn,
)
