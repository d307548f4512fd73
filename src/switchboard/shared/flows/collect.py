"""Collector children: a child spawned with ``collect: true`` ends into its requester's
completion log instead of announcing back; the requester collects it with ``agents_wait``.

The child's ``on_end`` step is the announce step (``flows.subagent``); for a collector it
freezes the outcome as for any child, then takes this path (``record_completion``): the
final answer is validated against the spawn's ``outputSchema`` (the text parsed as JSON,
or the first fenced ```json block of it), giving ``structured`` or ``schemaError``, the
text kept either way as ``result``; the completion is written once, in one step with its
entry in the requester's completion log and its group's freed slot; then the waits
registered on the child are fired and the runs parked on them resumed. Every part may
run twice and then does nothing new (the wake-up aside, which is harmless).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError
from jsonschema.exceptions import best_match as best_error

from switchboard.shared.services import Services
from switchboard.shared.store.spawns import SpawnRecord

# A run outcome as agents_wait reports it: done | failed | killed | timeout.
_STATUS = {"ok": "done", "timeout": "timeout", "cancelled": "killed", "killed": "killed"}
_FENCED = re.compile(r"```(?:json|JSON)?[ \t]*\r?\n(.*?)```", re.DOTALL)
# How deep an outputSchema may nest (objects and arrays inside each other): the schema
# checks recurse once a level, and a collector's answer is validated against it.
MAX_SCHEMA_DEPTH = 32
NOT_JSON = (
    "the final answer is not JSON: answer with the JSON value alone, or put it in a "
    "```json fenced block"
)


@dataclass(frozen=True)
class CollectPlan:
    """A collector child's extra settings, checked at spawn time."""

    output_schema: Mapping[str, Any] | None = None
    group_id: str = ""  # "" = the requester's ungrouped collectors


def child_prompt(plan: CollectPlan) -> str:
    """What a collector child is told beside its sub-agent prompt (markdown)."""
    text = (
        "## Collected result\n"
        "Your requester collects your final answer with agents_wait; it is not announced."
    )
    if plan.output_schema is None:
        return text
    schema = json.dumps(plan.output_schema, indent=2, sort_keys=True)
    return (
        f"{text}\nYour final answer must be the JSON value alone (or in one ```json fenced "
        f"block), valid against this JSON Schema:\n```json\n{schema}\n```"
    )


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a usable JSON Schema (checked against its own metaschema),
    or None."""
    if not isinstance(schema, dict):
        return "outputSchema must be a JSON Schema object"
    if nesting_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        return f"outputSchema nests deeper than {MAX_SCHEMA_DEPTH} levels"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except RecursionError:  # a recursive $ref the depth count cannot see
        return "outputSchema refers to itself too deeply to check"
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"outputSchema is not a valid JSON Schema: {exc.message}" + (
            f" (at {where})" if where else ""
        )
    return None


def nesting_depth(value: Any, stop_past: int) -> int:
    """How many objects/arrays deep ``value`` nests (counting stops past ``stop_past``),
    without recursion."""
    deepest = 0
    level: list[Any] = [value]
    while level and deepest <= stop_past:
        containers = [v for v in level if isinstance(v, dict | list)]
        if not containers:
            break
        deepest += 1
        level = [child for c in containers for child in (c.values() if isinstance(c, dict) else c)]
    return deepest


def record_fields(
    spawn_id: str,
    run_id: str,
    requester: str,
    child: str,
    label: str | None,
    plan: CollectPlan,
    now: int,
) -> dict[str, Any]:
    """A new collector record's fields (written with the spawn, before its run)."""
    return {
        "runId": run_id,
        "spawnId": spawn_id,
        "requesterKey": requester,
        "childKey": child,
        "label": label,
        "outputSchema": dict(plan.output_schema) if plan.output_schema is not None else None,
        "groupId": plan.group_id,
        "createdAt": now,
    }


def record_completion(svc: Services, spawn: SpawnRecord) -> None:
    """Write a finished collector child's completion once and wake whoever waits on it."""
    run_id = str(spawn.get("runId") or "")
    if not run_id:
        return
    store = svc.store.collect
    record = store.get(run_id)
    if record is None:
        return  # expired (or never written): nobody can wait on it any more
    fields = completion_fields(spawn, record.get("outputSchema"))
    requester = str(record.get("requesterKey") or spawn["requesterKey"])
    _, tokens = store.complete(run_id, requester, str(record.get("groupId") or ""), fields)
    wake(svc, tokens, run_id)


def wake(svc: Services, tokens: list[str], run_id: str) -> None:
    """Count a completion on the wait tokens registered on it; resume the runs parked on
    the tokens that fired."""
    waiters = svc.store.collect.fire(tokens, run_id)
    for waiter in svc.store.runs.get_many(waiters) if waiters else []:
        if waiter is not None and waiter.status == "parked":
            svc.queue.enqueue_resume(waiter.run_id, waiter.session_key)


def completion_fields(spawn: SpawnRecord, schema: Any) -> dict[str, Any]:
    """What agents_wait reports of a finished child, from its frozen outcome."""
    outcome = str(spawn.get("outcome") or "error")
    status = _STATUS.get(outcome, "failed")
    text = str(spawn.get("result") or "")
    fields: dict[str, Any] = {"status": status, "result": text}
    if status != "done":
        fields["error"] = str(spawn.get("error") or outcome)
    usage: Mapping[str, Any] = spawn.get("usage") or {}
    if usage:
        fields["usage"] = {
            "inputTokens": int(usage.get("input") or 0),
            "outputTokens": int(usage.get("output") or 0),
        }
    if status == "done" and isinstance(schema, dict):
        value, problem = validate_answer(text, schema)
        if problem is None:
            fields["structured"] = value
        else:
            fields["schemaError"] = problem
    return fields


def validate_answer(text: str, schema: Mapping[str, Any]) -> tuple[Any, str | None]:
    """(the answer's JSON value, None) when it validates against ``schema``, else
    (None, why not)."""
    found, value = parse_answer(text)
    if not found:
        return None, NOT_JSON
    validator_cls = jsonschema.validators.validator_for(schema)
    try:
        error = best_error(validator_cls(schema).iter_errors(value))
    except RecursionError:
        return None, "the answer nests too deeply to check against the outputSchema"
    if error is None:
        return value, None
    where = "/".join(str(p) for p in error.absolute_path)
    return None, error.message + (f" (at {where})" if where else "")


def parse_answer(text: str) -> tuple[bool, Any]:
    """(True, value) for an answer that is a JSON value, or holds a fenced JSON block."""
    stripped = text.strip()
    try:
        return True, json.loads(stripped)
    except (ValueError, RecursionError):
        pass
    for block in _FENCED.finditer(stripped):
        try:
            return True, json.loads(block.group(1).strip())
        except (ValueError, RecursionError):
            continue
    return False, None
