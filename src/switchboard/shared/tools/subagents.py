"""``subagents``: list my sub-agents, wait for some of them, or cancel one and its descendants.

OpenClaw's orchestration tool (reference "subagents"; ``src/agents/tools/subagents-tool.ts``).
Only the caller's own tree is visible and controllable: the spawns it made, their spawns,
and so on (``SpawnStore.spawns_of``), never by argument.

- ``list`` (default): the caller's children that are active, or ended within
  ``recentMinutes`` (default 30, at most 24 h), with status, outcome, delivery status and
  timings, and a text view.
- ``wait``: up to 32 ``taskIds`` (alias ``runIds``; a task is a run) of the caller's
  tree; answers as soon as one completes or needs attention, else at ``timeoutSeconds``
  (0-60, default 30; 0 = a snapshot). It never cancels and never consumes an announce.
  Inside an agent run the run is parked on the selected runs (no worker slot is held);
  over HTTP the api waits asynchronously.
- ``cancel``: the ``taskId`` (alias ``runId``) and every descendant, top down: queued and
  parked runs end ``cancelled`` at once, running ones are stopped by their worker
  (`runtime.cancel`); the requester is told once, by the cancelled run's own announce.

A row's ``deliveryStatus`` is OpenClaw 2026.9.6's (`gateway.completion`).
A row's ``status`` is OpenClaw's (``queued``, ``running``, ``waiting`` while the child's
session is yielded, ``completed``, ``failed``, ``timed_out``, ``cancelled``; a lost run
shows ``failed``); ``state`` is the run ledger's exact state (``lost`` included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.flows.yield_wake import current_run
from switchboard.shared.gateway.completion import delivery_status
from switchboard.shared.runtime.cancel import cancel_paused, cancel_run, cancel_session_runs
from switchboard.shared.services import Services
from switchboard.shared.store.run_records import (
    TERMINAL,
    RunRecord,
    ledger_state,
    now_ms,
)
from switchboard.shared.store.sessions import SessionEntry
from switchboard.shared.store.spawns import SpawnRecord
from switchboard.shared.tools.args import read_int, read_string
from switchboard.shared.tools.registry import ToolContext, ToolSpec, WaitFor

ACTIONS = ("list", "wait", "cancel")
DEFAULT_RECENT_MINUTES = 30
MAX_RECENT_MINUTES = 24 * 60
DEFAULT_WAIT_S = 30
MAX_WAIT_S = 60
MAX_WAIT_RUNS = 32
# Levels of descendants looked through (maxSpawnDepth is at most 5).
MAX_TREE_DEPTH = 8
OUTSIDE_TREE = "Task outside session tree."
LEAF_CANNOT_CONTROL = "Leaf subagents cannot cancel other sessions."
TOO_MANY_RUNS = f"subagents wait supports at most {MAX_WAIT_RUNS} taskIds."
# OpenClaw's row status of each ledger state (a lost run shows as failed there).
_ROW_STATUS = {"succeeded": "completed", "lost": "failed"}

DESCRIPTION = (
    "List native subagents, wait for selected taskIds, or cancel a taskId and its "
    "descendants. A wait timeout never cancels execution or consumes completion delivery."
)

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": list(ACTIONS),
            "description": "list (default) | wait | cancel.",
        },
        "recentMinutes": {
            "type": "integer",
            "minimum": 1,
            "description": "list: how far back ended runs are shown (default 30, max 1440).",
        },
        "taskId": {"type": "string", "description": "cancel: the task (run) to cancel."},
        "taskIds": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "maxItems": MAX_WAIT_RUNS,
            "description": "wait: the tasks (runs) to wait for (1-32).",
        },
        "runId": {"type": "string", "description": "Alias of taskId."},
        "runIds": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "description": "Alias of taskIds.",
        },
        "timeoutSeconds": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_WAIT_S,
            "description": "Wait duration in integer seconds, 0-60 (default: 30). "
            "Use 0 for a snapshot.",
        },
    },
}


@dataclass(frozen=True)
class _Node:
    """One spawn of the tree with what its row shows: ``run`` is the spawn's run, or the
    run that continues it after it yielded (its wake run, `yield_wake.current_run`)."""

    spawn: SpawnRecord
    run: RunRecord | None
    entry: SessionEntry | None
    depth: int
    # The spawn's run yielded and no run continues it yet.
    paused: bool = False

    @property
    def run_id(self) -> str:
        """The spawn's run (the id the caller knows, whichever run continues it)."""
        return str(self.spawn.get("runId") or "")

    @property
    def child_key(self) -> str:
        return str(self.spawn.get("childKey") or "")

    @property
    def stored_status(self) -> str:
        """The run's stored status (ok, error, ... ; the frozen outcome once it expired)."""
        if self.paused:
            return "running"
        if self.run is not None:
            return self.run.status
        return str(self.spawn.get("outcome") or ("queued" if self.run_id else "error"))

    @property
    def waiting(self) -> bool:
        """The child yielded its turn and waits for its own children (sessions_yield marks
        the entry with ``yieldedAt`` until their results are taken by its next run)."""
        return self.paused or (self.entry is not None and bool(self.entry.get("yieldedAt")))

    @property
    def state(self) -> str:
        return ledger_state(self.stored_status)

    @property
    def ended(self) -> bool:
        return self.stored_status in TERMINAL

    @property
    def ended_at(self) -> int | None:
        at = self.run.ended_at_ms if self.run is not None else None
        return at or self.spawn.get("endedAt")


# -- reading the tree ------------------------------------------------------------------------


def _children(svc: Services, requesters: Sequence[str], depth: int) -> list[_Node]:
    """The spawns of ``requesters`` (newest first each), with their runs and child
    sessions: three round trips for all of them."""
    spawns = svc.store.spawns
    ids = [sid for group in spawns.spawn_ids_of_many(requesters) for sid in group]
    records = [s for s in spawns.get_many(ids) if s is not None]
    runs = svc.store.runs.get_many([str(s.get("runId") or "") for s in records])
    entries = svc.store.sessions.get_many([str(s.get("childKey") or "") for s in records])
    nodes = []
    for spawn, run, entry in zip(records, runs, entries, strict=True):
        if run is not None and run.yielded:  # paused: the run that continues it, if any
            current = current_run(svc, run)
            nodes.append(_Node(spawn, current or run, entry, depth, paused=current is None))
        else:
            nodes.append(_Node(spawn, run, entry, depth))
    return nodes


def _tree(svc: Services, root_key: str) -> list[_Node]:
    """Every spawn below ``root_key``, level by level (its children first)."""
    out: list[_Node] = []
    level, seen = [root_key], {root_key}
    for depth in range(1, MAX_TREE_DEPTH + 1):
        nodes = _children(svc, level, depth)
        if not nodes:
            break
        out += nodes
        level = [n.child_key for n in nodes if n.child_key and n.child_key not in seen]
        seen.update(level)
    return out


def _row(svc: Services, node: _Node, now: int) -> dict[str, Any]:
    """One run as `list` and `wait` show it."""
    spawn = node.spawn
    state = node.state
    status = "waiting" if node.waiting else _ROW_STATUS.get(state, state)
    row: dict[str, Any] = {
        "taskId": node.run_id,
        "runId": node.run_id,
        "sessionKey": node.child_key,
        "label": str(spawn.get("label") or "") or None,
        "task": _short(str(spawn.get("task") or ""), 72),
        "status": status,
        "state": state,
    }
    if node.ended:
        error = node.run.error if node.run is not None else spawn.get("error")
        outcome: dict[str, Any] = {"status": node.stored_status}
        if error:
            outcome["error"] = _short(str(error), 120)
        row["outcome"] = outcome
    row["deliveryStatus"] = delivery_status(svc, node.spawn)
    started = (node.run.started_at_ms if node.run is not None else None) or spawn.get("startedAt")
    if started:
        row["startedAt"] = started
        row["runtimeMs"] = max(0, int((node.ended_at or now) - started))
    if node.ended_at:
        row["endedAt"] = node.ended_at
    if node.entry is not None and node.entry.get("model"):
        row["model"] = node.entry.get("model")
    return {k: v for k, v in row.items() if v is not None}


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- list -----------------------------------------------------------------------------------


def _list(ctx: ToolContext, args: Mapping[str, Any]) -> dict[str, Any]:
    svc = ctx.services
    minutes = read_int(
        args, "recentMinutes", default=DEFAULT_RECENT_MINUTES, lo=1, hi=MAX_RECENT_MINUTES
    )
    window = int(minutes or DEFAULT_RECENT_MINUTES)
    now = now_ms()
    since = now - window * 60_000
    nodes = _children(svc, [ctx.session_key], 1)
    active = [n for n in nodes if not n.ended or n.waiting]
    recent = [n for n in nodes if n.ended and not n.waiting and (n.ended_at or 0) >= since]
    recent.sort(key=lambda n: n.ended_at or 0, reverse=True)
    active_rows = [_row(svc, n, now) for n in active]
    recent_rows = [_row(svc, n, now) for n in recent]
    tasks = active_rows + recent_rows
    return {
        "status": "ok",
        "action": "list",
        "requesterSessionKey": ctx.session_key,
        "callerSessionKey": ctx.session_key,
        "callerIsSubagent": sk.is_subagent_key(ctx.session_key),
        "total": len(tasks),
        "taskTotal": len(tasks),
        "tasks": tasks,
        "active": active_rows,
        "recent": recent_rows,
        "text": _list_text(active_rows, recent_rows, window),
    }


def _list_text(
    active: Sequence[Mapping[str, Any]], recent: Sequence[Mapping[str, Any]], window: int
) -> str:
    lines = ["active subagents:"]
    index = 1
    for title, rows in (("", active), (f"recent (last {window}m):", recent)):
        if title:
            lines += ["", title]
        if not rows:
            lines.append("(none)")
        for row in rows:
            label = row.get("label") or row.get("task") or "task"
            runtime = _runtime(row.get("runtimeMs"))
            task = f" - {row['task']}" if row.get("task") and row.get("task") != label else ""
            lines.append(f"{index}. {label} ({runtime}) {row['status']}{task}")
            index += 1
    return "\n".join(lines)


def _runtime(ms: Any) -> str:
    if not isinstance(ms, int) or ms <= 0:
        return "n/a"
    seconds = round(ms / 1000)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60}m"


# -- wait -----------------------------------------------------------------------------------


def _read_run_ids(args: Mapping[str, Any]) -> list[str] | str:
    """The distinct task (run) ids to wait for, from ``taskIds`` or its alias ``runIds``,
    or the error text."""
    value = next(
        (args[k] for k in ("taskIds", "task_ids", "runIds", "run_ids") if args.get(k) is not None),
        None,
    )
    if value is None:
        return "taskIds required"
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return "taskIds must be an array of strings"
    ids = list(dict.fromkeys(v.strip() for v in value if v.strip()))
    if not ids:
        return "taskIds required"
    if len(ids) > MAX_WAIT_RUNS:
        return TOO_MANY_RUNS
    return ids


def _wait_state(ctx: ToolContext, run_ids: Sequence[str]) -> dict[str, Any]:
    """Where the selected runs stand: ``reason`` is None while none completed, needs
    attention or is unavailable (not in the caller's tree, or gone)."""
    svc = ctx.services
    now = now_ms()
    nodes = {n.run_id: n for n in _tree(svc, ctx.session_key) if n.run_id in run_ids}
    selected = [nodes[r] for r in run_ids if r in nodes]
    unavailable = [r for r in run_ids if r not in nodes]
    rows = [_row(svc, n, now) for n in selected]
    completed = [r["runId"] for r in rows if r["state"] in _ENDED and r["status"] != "waiting"]
    attention = [row["runId"] for row in rows if row.get("deliveryStatus") == "failed"]
    reason = (
        "unavailable"
        if unavailable
        else "attention"
        if attention
        else "completed"
        if completed
        else None
    )
    out: dict[str, Any] = {
        "reason": reason,
        "runs": rows,
        "completed": completed,
        "attention": attention,
        # Not shown: the runs whose end may change the answer (see `_wait`).
        "waitOn": [
            n.run.run_id if n.run is not None else n.run_id
            for n in selected
            if n.run_id not in completed
        ],
    }
    if unavailable:
        out["unavailable"] = unavailable
    return out


_ENDED = frozenset(ledger_state(s) for s in TERMINAL)


def _wait(ctx: ToolContext, args: Mapping[str, Any]) -> dict[str, Any]:
    run_ids = _read_run_ids(args)
    if isinstance(run_ids, str):
        return {"status": "error", "action": "wait", "error": run_ids}
    timeout_s = read_int(args, "timeoutSeconds", default=DEFAULT_WAIT_S, lo=0, hi=MAX_WAIT_S)
    state = _wait_state(ctx, run_ids)
    if state["reason"] is not None or not timeout_s:
        return _waited(state)
    # Parked on the runs whose end may change the answer: each selected run, or the run
    # that continues it after a yield.
    pending = list(state["waitOn"])
    context = {"runIds": run_ids, "timeoutS": timeout_s}
    raise WaitFor(pending[0], float(timeout_s), context, also=pending[1:])


def _waited(state: Mapping[str, Any]) -> dict[str, Any]:
    shown = {k: v for k, v in state.items() if k != "waitOn"}
    return {"status": "ok", "action": "wait", **shown, "reason": state["reason"] or "timeout"}


def _wait_ready(ctx: ToolContext, context: Mapping[str, Any]) -> bool:
    """A parked wait can be answered: a selected run completed or needs attention."""
    return _wait_state(ctx, list(context.get("runIds") or ()))["reason"] is not None


def complete(
    ctx: ToolContext, context: Mapping[str, Any], target: RunRecord | None
) -> dict[str, Any]:
    """The wait's answer once a selected run ended or the timeout passed (read afresh)."""
    return _waited(_wait_state(ctx, list(context.get("runIds") or ())))


# -- cancel ---------------------------------------------------------------------------------


def _cancel(ctx: ToolContext, args: Mapping[str, Any]) -> dict[str, Any]:
    svc = ctx.services
    run_id = read_string(args, "taskId") or read_string(args, "runId")
    if not run_id:
        return _refused(None, "taskId required")
    entry = svc.store.sessions.get(ctx.session_key)
    if entry is not None and entry.get("subagentControlScope") == "none":
        return _refused(run_id, LEAF_CANNOT_CONTROL)
    target = next((n for n in _tree(svc, ctx.session_key) if n.run_id == run_id), None)
    if target is None:
        return _refused(run_id, OUTSIDE_TREE)
    below = _tree(svc, target.child_key)
    outcomes = [(node, _cancel_node(svc, node)) for node in (target, *below)]
    stopped = [(node, verdict) for node, verdict in outcomes if verdict]
    cascade = [node for node, _ in stopped if node is not target]
    labels = [str(n.spawn.get("label") or n.spawn.get("task") or n.run_id) for n in cascade]
    result: dict[str, Any] = {
        "status": "cancelled" if stopped else "error",
        "action": "cancel",
        "taskId": run_id,
        "runId": run_id,
        "sessionKey": target.child_key,
        "found": True,
        "cancelled": bool(stopped),
        "cascadeCancelled": len(cascade),
        "runs": [
            {"runId": n.run_id, "sessionKey": n.child_key, "state": verdict}
            for n, verdict in stopped
        ],
    }
    if labels:
        result["cascadeLabels"] = [_short(label, 48) for label in labels]
    if not stopped:
        result["reason"] = f"task already ended ({target.state})"
    return result


def _refused(task_id: str | None, error: str) -> dict[str, Any]:
    """A cancel that found nothing it may cancel: OpenClaw's error shape."""
    out: dict[str, Any] = {"status": "error", "action": "cancel"}
    if task_id:
        out |= {"taskId": task_id, "runId": task_id}
    return out | {"found": False, "cancelled": False, "reason": error, "error": error}


def _cancel_node(svc: Services, node: _Node) -> str | None:
    """Cancel a spawn's run and whatever else runs in its child session: 'cancelled'
    (ended now), 'cancelling' (its worker stops it within a second) or None (nothing was
    left to cancel)."""
    done = cancel_session_runs(svc, node.child_key) if node.child_key else {}
    if node.paused and node.run is not None:  # yielded, not continued: end the chain here
        done[node.run.run_id] = cancel_paused(svc, node.run)
    elif node.run_id and node.run_id not in done:
        done[node.run_id] = cancel_run(svc, node.run_id, node.child_key)
    verdicts = {res.verdict for res in done.values()}
    if "requested" in verdicts:
        return "cancelling"
    return "cancelled" if "cancelled" in verdicts else None


# -- the tool ----------------------------------------------------------------------------------


def handle(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Dispatch on ``action`` (default ``list``)."""
    action = read_string(args, "action") or "list"
    if action == "list":
        return _list(ctx, args)
    if action == "wait":
        return _wait(ctx, args)
    if action == "cancel":
        return _cancel(ctx, args)
    return {"status": "error", "error": "Unsupported action."}


SPEC = ToolSpec(
    name="subagents",
    description=DESCRIPTION,
    parameters=PARAMETERS,
    handler=handle,
    complete=complete,
    ready=_wait_ready,
)
