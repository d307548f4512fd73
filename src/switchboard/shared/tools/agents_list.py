"""`agents_list`: the agent ids the caller may target with `sessions_spawn` (SPEC §8).

Allowed = the caller's own agent, plus either every configured agent (the allow list
holds `*`) or the ids ``subagents.allowAgents`` names, configured or not (reference §7.9).
"""

from __future__ import annotations

from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.config import SwitchboardConfig
from switchboard.shared.tools.offer import offered_names
from switchboard.shared.tools.registry import ToolContext, ToolSpec


def allowed_agent_ids(config: SwitchboardConfig, requester: str) -> tuple[bool, list[str]]:
    """(allowAny, ids): the ids ``requester`` may spawn into, itself first, the rest sorted."""
    allow = config.subagents_for(requester).allow_agents
    allow_any = "*" in allow
    if allow_any:
        others = {entry.id for entry in config.agents.list}
    else:
        others = {sk.normalize_agent_id(name) for name in allow}
    return allow_any, [requester, *sorted(others - {requester})]


def _agent_row(config: SwitchboardConfig, agent_id: str) -> dict[str, Any]:
    entry = config.agent(agent_id)
    row: dict[str, Any] = {"id": agent_id}
    if entry is not None and entry.name and entry.name.strip():
        row["name"] = entry.name.strip()
    row["configured"] = entry is not None
    return row


def _with_tools(ctx: ToolContext, row: dict[str, Any]) -> dict[str, Any]:
    """The row with the tools a main session of that agent is offered."""
    agent_id = str(row["id"])
    svc = ctx.services
    main = sk.main_session_key(agent_id, svc.config.session.main_key)
    row["tools"] = offered_names(svc, agent_id, main, {})
    return row


def _agents_list(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    config = ctx.services.config
    allow_any, ids = allowed_agent_ids(config, ctx.agent_id)
    return {
        "requester": ctx.agent_id,
        "allowAny": allow_any,
        "agents": [_with_tools(ctx, _agent_row(config, agent_id)) for agent_id in ids],
    }


SPEC = ToolSpec(
    name="agents_list",
    description="List agent ids you can target with sessions_spawn (based on allowlists).",
    parameters={"type": "object", "properties": {}},
    handler=_agents_list,
)
