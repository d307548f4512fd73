"""`sessions_spawn`'s collector parameters: `collect`, `outputSchema`, `groupId`.

A collector child ("swarm", reference §5.3) does not announce back: its completion goes
to its requester's completion log and the requester collects it with `agents_wait`. The
checks follow OpenClaw's: the parameters need `tools.swarm.enabled`; `outputSchema` and
`groupId` need `collect`; `collect` is for one-shot runs (not `thread` or `mode:
"session"`); an `outputSchema` must itself be a valid JSON Schema. Collector children do
not count towards `maxChildrenPerAgent`; their group's caps (`tools.swarm.
maxChildrenPerGroup`, `maxTotalPerGroup`) are checked and taken in one step instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from switchboard.shared.errors import InvalidInput
from switchboard.shared.flows.collect import CollectPlan, schema_problem
from switchboard.shared.services import Services

PARAMS = ("collect", "outputSchema", "groupId")
# A group id is a key part: no whitespace, glob characters or braces.
_GROUP_ID = re.compile(r"^[A-Za-z0-9_.:@/-]{1,128}$")

PROPERTIES: dict[str, Any] = {
    "collect": {
        "type": "boolean",
        "description": "A collector child: no completion announce; collect its result "
        "with agents_wait (its runId).",
    },
    "outputSchema": {
        "type": "object",
        "description": "JSON Schema of the child's structured result (requires collect): "
        "its final answer is validated (structured, or schemaError).",
    },
    "groupId": {
        "type": "string",
        "description": "Group parallel collectors (requires collect); groups have caps.",
    },
}


# The accepted spawn's note for collector children (instead of the announce guidance).
NOTE = (
    "Collector child: no completion announce. Collect its result with agents_wait "
    "(ids: its runId); call again with the pending ids until none is left."
)


class CollectRefused(Exception):
    """A collector spawn refused by a group cap (`status: forbidden`)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.result = {"status": "forbidden", "error": error}


def collect_plan(
    svc: Services, args: Mapping[str, Any], *, mode: str, thread: bool
) -> CollectPlan | None:
    """The collector settings of a spawn, checked; None for an ordinary child."""
    given = [name for name in PARAMS if args.get(name) is not None]
    if not given:
        return None
    if not svc.config.tools.swarm.enabled:
        raise InvalidInput(
            f'sessions_spawn parameter "{given[0]}" requires tools.swarm.enabled=true.',
            field=given[0],
        )
    raw = args.get("collect")
    if raw is not None and not isinstance(raw, bool):
        raise InvalidInput("collect must be a boolean", field="collect")
    if raw is not True:
        for name in ("outputSchema", "groupId"):
            if args.get(name) is not None:
                raise InvalidInput(f"{name} requires collect: true", field=name)
        return None
    if thread or mode == "session":
        raise InvalidInput(
            'collect cannot be combined with thread=true or mode="session"', field="collect"
        )
    schema = args.get("outputSchema")
    if schema is not None:
        problem = schema_problem(schema)
        if problem is not None:
            raise InvalidInput(problem, field="outputSchema")
    group = args.get("groupId")
    if group is not None and (not isinstance(group, str) or not _GROUP_ID.match(group.strip())):
        raise InvalidInput(
            "groupId must be 1-128 characters of letters, digits and _ . : @ / -",
            field="groupId",
        )
    return CollectPlan(output_schema=schema, group_id=(group or "").strip())


def reserve_group(svc: Services, requester: str, plan: CollectPlan, n: int) -> None:
    """Take ``n`` slots of the plan's group, or refuse naming the cap's config key."""
    swarm = svc.config.tools.swarm
    verdict, active, total = svc.store.collect.reserve_group(
        requester,
        plan.group_id,
        n,
        max_active=swarm.max_children_per_group,
        max_total=swarm.max_total_per_group,
    )
    if verdict == "active":
        limit = swarm.max_children_per_group
        raise CollectRefused(
            f"sessions_spawn reached tools.swarm.maxChildrenPerGroup ({active}/{limit})."
        )
    if verdict == "total":
        limit = swarm.max_total_per_group
        raise CollectRefused(
            f"sessions_spawn reached tools.swarm.maxTotalPerGroup ({total}/{limit})."
        )


def release_group(svc: Services, requester: str, plan: CollectPlan, n: int) -> None:
    """Give back slots of children that were never started."""
    svc.store.collect.release_group(requester, plan.group_id, n)
