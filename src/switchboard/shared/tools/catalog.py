"""The session tools this product offers, registered into a ToolRegistry."""

from __future__ import annotations

from switchboard.shared.tools.offer import external_for_session, tools_for_session
from switchboard.shared.tools.registry import ToolRegistry, ToolSpec

# One import per tool module (each defines SPEC: ToolSpec):
# TOOLS-BEGIN
# isort: split
from switchboard.shared.tools import agents_list, sessions_history, sessions_list

# isort: split
from switchboard.shared.tools import sessions_spawn

# isort: split
from switchboard.shared.tools import sessions_send

# isort: split
from switchboard.shared.tools import session_status

# isort: split
from switchboard.shared.tools import sessions_yield

# isort: split
from switchboard.shared.tools import agents_wait

# isort: split
from switchboard.shared.tools import subagents

# TOOLS-END

ALL_TOOLS: list[ToolSpec] = [
    # ALL-TOOLS-BEGIN
    sessions_list.SPEC,
    sessions_history.SPEC,
    agents_list.SPEC,
    sessions_spawn.SPEC,
    sessions_send.SPEC,
    session_status.SPEC,
    sessions_yield.SPEC,
    agents_wait.SPEC,
    subagents.SPEC,
    # ALL-TOOLS-END
]


def register_session_tools(registry: ToolRegistry) -> ToolRegistry:
    """Add every session tool to ``registry``, and the rule for which a session is offered."""
    for spec in ALL_TOOLS:
        registry.register(spec)
    registry.offer = tools_for_session
    registry.external = external_for_session
    return registry
