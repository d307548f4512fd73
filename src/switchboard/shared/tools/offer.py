"""Which tools a session is offered, in agent runs and over /tools/invoke alike.

One rule for every tool, the session tools as the MCP and Python tools: the sub-agent
policy for the session's role (`tool_policy.allowed_tools`; MCP and Python tools are not
session tools, so sub-agents keep them), then `tools.allow|deny`, then the agent's own
`agents.list[].tools` (`tool_policy.permitted`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.policy import tool_policy
from switchboard.shared.services import Services
from switchboard.shared.tools.registry import ToolContext, ToolSpec


def tools_for_session(
    svc: Services, ctx: ToolContext, session: Mapping[str, Any] | None = None
) -> list[ToolSpec]:
    """The session tools a session may use (sub-agents lose the session tools).

    ``session`` is the session's stored entry when the caller has just read it."""
    specs = list(svc.tools.tools.values())
    if not svc.config.tools.swarm.enabled:  # OpenClaw offers agents_wait with Swarm only
        specs = [s for s in specs if s.name != "agents_wait"]
    infos = [tool_policy.ToolInfo(s.name, s.session_tool) for s in specs]
    allowed = set(permitted_tools(svc, ctx, infos, session))
    return [s for s in specs if s.name in allowed]


def external_for_session(
    svc: Services, ctx: ToolContext, names: Sequence[str], session: Mapping[str, Any] | None
) -> list[str]:
    """Of the MCP and Python tools ``names``, those a session may use."""
    infos = [tool_policy.ToolInfo(name, session_tool=False) for name in names]
    return permitted_tools(svc, ctx, infos, session)


def permitted_tools(
    svc: Services,
    ctx: ToolContext,
    tools: Sequence[tool_policy.ToolInfo],
    session: Mapping[str, Any] | None = None,
) -> list[str]:
    """The names of ``tools`` the acting session may use, in order."""
    config = svc.config
    layers = [_rules(config.tools.allow, config.tools.also_allow, config.tools.deny)]
    entry = config.agent(ctx.agent_id)
    if entry is not None and entry.tools is not None:
        layers.append(_rules(entry.tools.allow, entry.tools.also_allow, entry.tools.deny))
    role = _role(svc, ctx, session)
    configured = config.tools.subagents.tools
    rules = _rules(configured.allow, configured.also_allow, configured.deny)
    return tool_policy.permitted(role, tools, rules if role != "main" else _NONE, layers)


_NONE = tool_policy.ToolRules()


def _rules(allow: list[str], also_allow: list[str], deny: list[str]) -> tool_policy.ToolRules:
    return tool_policy.ToolRules(tuple(allow), tuple(also_allow), tuple(deny))


def _role(
    svc: Services, ctx: ToolContext, session: Mapping[str, Any] | None
) -> tool_policy.SubagentRole:
    """The session's role: main, or a sub-agent's (orchestrator or leaf)."""
    if ctx.spawn_depth < 1 and not sk.is_subagent_key(ctx.session_key):
        return "main"
    if session is None:
        entry = svc.store.sessions.get(ctx.session_key)
        session = entry.fields if entry else {}
    subagents = svc.config.subagents_for(ctx.agent_id)
    return tool_policy.subagent_role(
        max(ctx.spawn_depth, 1), subagents.max_spawn_depth, stored=session.get("subagentRole")
    )


def offered_names(
    svc: Services, agent_id: str, session_key: str, session: Mapping[str, Any] | None = None
) -> list[str]:
    """The names of every tool a session of ``agent_id`` is offered (shown by
    `agents_list` and `session_status`): its session tools, then its MCP and Python
    tools as this process knows them (a server it has not listed yet shows as
    ``<server>__*``)."""
    fields = session or {}
    depth = int(str(fields.get("spawnDepth") or 0) or 0)
    ctx = ToolContext(svc, session_key, agent_id, spawn_depth=depth)
    names = [s.name for s in tools_for_session(svc, ctx, fields)]
    if svc.extra_tools is not None:
        names += external_for_session(svc, ctx, svc.extra_tools.known_names(), fields)
    return names
