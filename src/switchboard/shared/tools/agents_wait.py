"""`agents_wait`: collect collector children (`sessions_spawn` with `collect: true`).

OpenClaw's fan-out barrier (reference §5.3): up to 1,000 run ids; answers as soon as at
least one has completed, or none is pending, or at the timeout, with the completed ones
in completion order and the ids still pending, so a caller drains a fan-out by calling
again with ``pending`` (all, any, or N of M). A completed record is kept for
``runs.retentionHours`` and asking again answers the same. Only the collector's requester
may wait on it: another requester's ids come back as ``not_found``, as unknown ones do,
so a caller cannot learn which run ids exist.

``required: true`` (OpenClaw's newest) waits for *all* of them instead, up to
``tools.swarm.waitTimeoutSecondsMax``; it takes no ``timeoutSeconds``.

Every read is one step on the store, whatever the number of ids (`CollectStore.read`).
When nothing has completed yet (or, required, something is pending) the same step
registers a wait token on the pending children; the tool then waits on that token as on
a run (``WaitFor``): inside an agent run the run is parked (no worker slot is held) and
resumed when the first of them (required: the last) completes or at the timeout; over
HTTP the api waits asynchronously. ``complete`` reads the children again and answers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from switchboard.shared.errors import InvalidInput
from switchboard.shared.store.collect import NOT_FOUND, PENDING, WaitRead
from switchboard.shared.store.run_records import RunRecord
from switchboard.shared.tools.args import read_number
from switchboard.shared.tools.registry import ToolContext, ToolSpec, WaitFor

DEFAULT_TIMEOUT_S = 30
MAX_IDS = 1000
# A wait token outlives its wait by this much (a parked run resumed late still finds it).
_TOKEN_EXTRA_S = 3600
REQUIRED_WITH_TIMEOUT = "required agents_wait cannot also specify timeoutSeconds."
# Run ids are key parts: anything else cannot name a collector (`not_found`).
_RUN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")

DESCRIPTION = (
    "Wait for collector sub-agents (spawned with sessions_spawn collect: true) and collect "
    "their results. Pass their runIds as `ids` (1-1000). Returns as soon as at least one "
    "has completed, or none is pending, or at `timeoutSeconds` (default 30): "
    "{completed: [{runId, status: done|failed|killed|timeout, result, structured?, "
    "error?, schemaError?, sessionKey, label?, usage?}], pending: [runId], errors?: "
    "[{runId, error: not_found}]}; completed in completion order. Call again "
    "with the pending ids to collect the rest."
)

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "ids": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "maxItems": MAX_IDS,
            "description": "Run ids of collector children (from sessions_spawn).",
        },
        "timeoutSeconds": {
            "type": "number",
            "minimum": 0,
            "description": "Seconds to wait for a first completion (default 30; 0 = look "
            "without waiting; capped by tools.swarm.waitTimeoutSecondsMax).",
        },
        "required": {
            "type": "boolean",
            "description": "Wait for all ids (up to tools.swarm.waitTimeoutSecondsMax); "
            "not with timeoutSeconds.",
        },
    },
    "required": ["ids"],
}


def handle(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Answer now (something completed, nothing pending, or no wait asked), or wait."""
    ids = read_ids(args)
    required = args.get("required")
    if required is not None and not isinstance(required, bool):
        raise InvalidInput("required must be a boolean", field="required")
    if required and args.get("timeoutSeconds") is not None:
        raise InvalidInput(REQUIRED_WITH_TIMEOUT, field="timeoutSeconds")
    timeout_s = _timeout_s(ctx, args, required=bool(required))
    mode = "none" if timeout_s <= 0 else "all" if required else "any"
    read = _read(ctx, ids, mode=mode, ttl_s=int(timeout_s) + _TOKEN_EXTRA_S)
    if read.token is None:
        return result_of(ids, read)
    context = {"ids": ids, "token": read.token, "timeoutS": timeout_s}
    raise WaitFor(read.token, timeout_s, context)


def complete(
    ctx: ToolContext, context: Mapping[str, Any], target: RunRecord | None
) -> dict[str, Any]:
    """After the wait (a completion fired the token, or the timeout): read again."""
    ids = [str(i) for i in context.get("ids") or []]
    read = _read(ctx, ids, mode="none", ttl_s=0)
    token = context.get("token")
    if token:
        ctx.services.store.collect.drop_token(str(token))
    return result_of(ids, read)


def read_ids(args: Mapping[str, Any]) -> list[str]:
    """``ids``: 1-1,000 strings, trimmed and de-duplicated (first place kept)."""
    raw = args.get("ids")
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("ids must be a non-empty list of run ids", field="ids")
    if not all(isinstance(item, str) for item in raw):
        raise InvalidInput("ids must be a list of strings", field="ids")
    ids = list(dict.fromkeys(item.strip() for item in raw if item.strip()))
    if not ids:
        raise InvalidInput("ids must be a non-empty list of run ids", field="ids")
    if len(ids) > MAX_IDS:
        raise InvalidInput(f"ids takes at most {MAX_IDS} run ids", field="ids")
    return ids


def _timeout_s(ctx: ToolContext, args: Mapping[str, Any], *, required: bool) -> float:
    cap = ctx.services.config.tools.swarm.wait_timeout_seconds_max
    if required:
        return float(cap)
    value = read_number(args, "timeoutSeconds")
    return float(min(max(DEFAULT_TIMEOUT_S if value is None else value, 0.0), cap))


def _read(ctx: ToolContext, ids: Sequence[str], *, mode: str, ttl_s: int) -> WaitRead:
    """The store's read of the well-formed ids; the rest are unknown."""
    wellformed = [i for i in ids if _RUN_ID.match(i)]
    read = ctx.services.store.collect.read(ctx.session_key, wellformed, mode=mode, ttl_s=ttl_s)
    found = {i: read.found.get(i, NOT_FOUND) for i in ids}
    return WaitRead(found=found, token=read.token)


def result_of(ids: Sequence[str], read: WaitRead) -> dict[str, Any]:
    """The tool result: completed (in completion order), pending, errors."""
    done: list[tuple[tuple[int, int], dict[str, Any]]] = []
    pending: list[str] = []
    errors: list[dict[str, str]] = []
    for run_id in ids:
        state = read.found[run_id]
        if isinstance(state, dict):
            done.append((_seq(state.get("completedSeq")), _item(run_id, state)))
        elif state == PENDING:
            pending.append(run_id)
        else:  # another requester's collector reads as an unknown id
            errors.append({"runId": run_id, "error": NOT_FOUND})
    done.sort(key=lambda pair: pair[0])
    out: dict[str, Any] = {"completed": [item for _, item in done], "pending": pending}
    if errors:
        out["errors"] = errors
        if len(errors) == len(ids):
            out["success"] = False
    return out


def _item(run_id: str, record: Mapping[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "runId": run_id,
        "status": record.get("status") or "failed",
        "result": record.get("result") or "",
    }
    if "structured" in record:
        item["structured"] = record["structured"]
    if record.get("error"):
        item["error"] = record["error"]
    if record.get("schemaError"):
        item["schemaError"] = record["schemaError"]
    item["sessionKey"] = record.get("childKey") or ""
    if record.get("label"):
        item["label"] = record["label"]
    if record.get("usage"):
        item["usage"] = record["usage"]
    return item


def _seq(value: Any) -> tuple[int, int]:
    """A completion-log entry id (``<ms>-<n>``) as a sortable pair."""
    ms, _, n = str(value or "0-0").partition("-")
    try:
        return int(ms), int(n or 0)
    except ValueError:
        return 0, 0


SPEC = ToolSpec(
    name="agents_wait",
    description=DESCRIPTION,
    parameters=PARAMETERS,
    handler=handle,
    complete=complete,
)
