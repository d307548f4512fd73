"""Who a tool call may see: the visibility guard built from the acting session, on the server."""

from __future__ import annotations

from switchboard.shared.policy.visibility import VisibilityGuard, spawned_closure
from switchboard.shared.tools.registry import ToolContext


def visibility_guard(ctx: ToolContext) -> VisibilityGuard:
    """The guard for this call: requester = the run's own session, spawned = its subtree."""
    sessions = ctx.services.store.sessions
    return VisibilityGuard(
        ctx.services.config,
        requester_key=ctx.session_key,
        sandboxed=ctx.sandboxed,
        spawned_loader=lambda: spawned_closure(ctx.session_key, sessions.children),
    )
