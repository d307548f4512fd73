"""The session tools this product offers, registered into a ToolRegistry."""

from __future__ import annotations

from switchboard.shared.tools.registry import ToolRegistry, ToolSpec

# One import per tool module (each defines SPEC: ToolSpec):
# TOOLS-BEGIN
# TOOLS-END

ALL_TOOLS: list[ToolSpec] = [
    # ALL-TOOLS-BEGIN
    # ALL-TOOLS-END
]


def register_session_tools(registry: ToolRegistry) -> ToolRegistry:
    """Add every session tool to ``registry``."""
    for spec in ALL_TOOLS:
        registry.register(spec)
    return registry
