"""Which tools a session is offered, in agent runs and over /tools/invoke alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.policy import tool_policy
from switchboard.shared.services import Services
from switchboard.shared.tools.registry import ToolContext, ToolSpec


def tools_for_session(
    svc: Services, ctx: ToolContext, session: Mapping[str, Any] | None = None
) -> list[ToolSpec]:
    """The tools a session may use: all of them, minus the session tools for sub-agents.

    ``session`` is the session's stored entry when the caller has just read it."""
    specs = list(svc.tools.tools.values())
    if not svc.config.tools.swarm.enabled:  # OpenClaw offers agents_wait with Swarm only
        specs = [s for s in specs if s.name != "agents_wait"]
    if ctx.spawn_depth < 1 and not sk.is_subagent_key(ctx.session_key):
        return specs
    if session is None:
        entry = svc.store.sessions.get(ctx.session_key)
        session = entry.fields if entry else {}
    subagents = svc.config.subagents_for(ctx.agent_id)
    role = tool_policy.subagent_role(
        max(ctx.spawn_depth, 1),
        subagents.max_spawn_depth,
        stored=session.get("subagentRole"),
    )
    configured = svc.config.tools.subagents.tools
    rules = tool_policy.ToolRules(
        tuple(configured.allow), tuple(configured.also_allow), tuple(configured.deny)
    )
    infos = [tool_policy.ToolInfo(s.name, s.session_tool) for s in specs]
    allowed = set(tool_policy.allowed_tools(role, infos, rules))
    return [s for s in specs if s.name in allowed]
