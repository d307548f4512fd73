"""Who may see which session: visibility levels, the sandbox clamp, agent-to-agent policy.

Pure decisions. The caller resolves both keys to canonical store keys and, for ``tree``,
looks up the sessions the requester spawned; nothing here touches Redis.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Literal

from switchboard.shared.config import SwitchboardConfig
from switchboard.shared.keys import agent_id_of

Action = Literal["list", "history", "send", "status", "search"]
Visibility = Literal["self", "tree", "agent", "all"]

# The exact messages OpenClaw returns (reference §7.1 and, for status, the short reference's
# session_status section), per action.
_PREFIX: dict[str, str] = {
    "list": "Session list",
    "history": "Session history",
    "send": "Session send",
    "status": "Session status",
    "search": "Session search",
}
_A2A_DISABLED: dict[str, str] = {
    "list": "Agent-to-agent listing is disabled. "
    "Set tools.agentToAgent.enabled=true to allow cross-agent visibility.",
    "history": "Agent-to-agent history is disabled. "
    "Set tools.agentToAgent.enabled=true to allow cross-agent access.",
    "send": "Agent-to-agent messaging is disabled. "
    "Set tools.agentToAgent.enabled=true to allow cross-agent sends.",
    "status": "Agent-to-agent status is disabled. "
    "Set tools.agentToAgent.enabled=true to allow cross-agent access.",
    "search": "Agent-to-agent search is disabled. "
    "Set tools.agentToAgent.enabled=true to allow cross-agent access.",
}
_A2A_DENIED: dict[str, str] = {
    "list": "Agent-to-agent listing denied by tools.agentToAgent.allow.",
    "history": "Agent-to-agent history denied by tools.agentToAgent.allow.",
    "send": "Agent-to-agent messaging denied by tools.agentToAgent.allow.",
    "status": "Agent-to-agent session status denied by tools.agentToAgent.allow.",
    "search": "Agent-to-agent search denied by tools.agentToAgent.allow.",
}


@dataclass(frozen=True)
class Verdict:
    """The outcome of one visibility check; ``error`` is set exactly when forbidden."""

    allowed: bool
    status: Literal["ok", "forbidden"]
    error: str | None


ALLOWED = Verdict(allowed=True, status="ok", error=None)


def forbidden(error: str) -> Verdict:
    """A forbidden verdict carrying the message shown to the model."""
    return Verdict(allowed=False, status="forbidden", error=error)


def cross_visibility_message(action: Action) -> str:
    """The message for a cross-agent target when visibility is not ``all``."""
    return (
        f"{_PREFIX[action]} visibility is restricted. "
        "Set tools.sessions.visibility=all to allow cross-agent access; "
        "use tools.agentToAgent to restrict permitted agent pairs."
    )


def self_visibility_message(action: Action) -> str:
    """The message for another session when visibility is ``self``."""
    return (
        f"{_PREFIX[action]} visibility is restricted to the current session "
        "(tools.sessions.visibility=self)."
    )


def tree_visibility_message(action: Action) -> str:
    """The message for a session outside the requester's tree when visibility is ``tree``."""
    return (
        f"{_PREFIX[action]} visibility is restricted to the current session tree "
        "(tools.sessions.visibility=tree)."
    )


def a2a_disabled_message(action: Action) -> str:
    """The message for a cross-agent target while ``tools.agentToAgent.enabled`` is off."""
    return _A2A_DISABLED[action]


def a2a_denied_message(action: Action) -> str:
    """The message for a cross-agent pair that ``tools.agentToAgent.allow`` does not cover."""
    return _A2A_DENIED[action]


def matches_allow(pattern_list: Iterable[str], agent_id: str) -> bool:
    """Tell whether an agent id matches an allow list (empty list = any agent).

    A pattern is ``*`` (any), an exact case-sensitive id, or a glob whose ``*`` stands for
    any run of characters, matched whole and case-insensitively. Blank patterns never match.
    """
    patterns = list(pattern_list)
    if not patterns:
        return True
    return any(_matches_pattern(pattern.strip(), agent_id) for pattern in patterns)


def _matches_pattern(pattern: str, agent_id: str) -> bool:
    """Match one trimmed allow-list pattern against an agent id."""
    if not pattern:
        return False
    if pattern == "*":
        return True
    if "*" not in pattern:
        return pattern == agent_id
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, agent_id, re.IGNORECASE) is not None


def a2a_allowed(config: SwitchboardConfig, requester_agent: str, target_agent: str) -> bool:
    """Tell whether agent-to-agent policy lets these two agents reach each other.

    The same agent always may; different agents need ``tools.agentToAgent.enabled`` and
    both ids matching ``tools.agentToAgent.allow``.
    """
    if requester_agent == target_agent:
        return True
    policy = config.tools.agent_to_agent
    if not policy.enabled:
        return False
    return matches_allow(policy.allow, requester_agent) and matches_allow(
        policy.allow, target_agent
    )


def effective_visibility(
    config: SwitchboardConfig, *, sandboxed: bool, agent_id: str | None = None
) -> Visibility:
    """The visibility a requester gets: the configured level, clamped for sandboxed sessions.

    A sandboxed session whose sandbox says ``sessionToolsVisibility: "spawned"`` (the
    default) gets ``tree`` whatever is configured; like OpenClaw, even ``self`` is widened
    to ``tree`` (SPEC §2: "clamped to tree"). ``agent_id`` picks that agent's sandbox
    settings; without it the ``agents.defaults.sandbox`` ones apply.
    """
    configured = config.tools.sessions.visibility
    if not sandboxed:
        return configured
    sandbox = config.sandbox_for(agent_id) if agent_id else config.agents.defaults.sandbox
    return "tree" if sandbox.session_tools_visibility == "spawned" else configured


def check_visibility(
    config: SwitchboardConfig,
    *,
    action: Action,
    requester_key: str,
    target_key: str,
    visibility: Visibility,
    spawned: Collection[str],
) -> Verdict:
    """Decide whether the requester session may ``action`` the target session.

    Both keys are canonical store keys, compared exactly. ``spawned`` is the set of sessions
    the requester spawned, transitively (SPEC §2); it is only consulted under ``tree``.
    """
    if target_key == requester_key:
        return ALLOWED
    # Fix vs OpenClaw (reference §10, PR #56019/#56028, issue #54878): OpenClaw runs the
    # cross-agent gate first, so a child spawned into another agent is hidden under `tree`
    # although `tree` means "my session and what I spawned". Here a session in the
    # requester's spawned tree is visible under `tree` whichever agent owns it. As in the
    # upstream fix, `self`, `agent` and `all` are unchanged.
    if visibility == "tree" and target_key in spawned:
        return ALLOWED
    requester_agent = agent_id_of(requester_key)
    target_agent = agent_id_of(target_key)
    if requester_agent != target_agent:
        return _check_cross_agent(config, action, visibility, requester_agent, target_agent)
    if visibility == "self":
        return forbidden(self_visibility_message(action))
    if visibility == "tree":
        return forbidden(tree_visibility_message(action))
    return ALLOWED


def _check_cross_agent(
    config: SwitchboardConfig,
    action: Action,
    visibility: Visibility,
    requester_agent: str,
    target_agent: str,
) -> Verdict:
    """Cross-agent access: needs visibility ``all``, a2a enabled, and both ids allowed."""
    if visibility != "all":
        return forbidden(cross_visibility_message(action))
    if not config.tools.agent_to_agent.enabled:
        return forbidden(a2a_disabled_message(action))
    if not a2a_allowed(config, requester_agent, target_agent):
        return forbidden(a2a_denied_message(action))
    return ALLOWED


def spawned_closure(root_key: str, children_of: Callable[[str], Iterable[str]]) -> frozenset[str]:
    """Every session spawned below ``root_key``, transitively (the root itself excluded).

    ``children_of`` returns the direct children of one key (the caller's lookup); cycles
    and repeats are visited once.
    """
    seen: set[str] = set()
    pending = deque([root_key])
    while pending:
        for child in children_of(pending.popleft()):
            if child != root_key and child not in seen:
                seen.add(child)
                pending.append(child)
    return frozenset(seen)


class VisibilityGuard:
    """The visibility checks of one tool call, made from the requesting run's own identity.

    The effective visibility is fixed at construction; the spawned set is loaded once, on
    the first check that needs it, and only under ``tree``. Errors from the loader
    propagate (a store outage is not a "forbidden").
    """

    def __init__(
        self,
        config: SwitchboardConfig,
        *,
        requester_key: str,
        sandboxed: bool,
        spawned_loader: Callable[[], Collection[str]],
    ) -> None:
        self._config = config
        self._requester_key = requester_key
        self._loader = spawned_loader
        self._spawned: Collection[str] | None = None
        self.visibility: Visibility = effective_visibility(
            config, sandboxed=sandboxed, agent_id=agent_id_of(requester_key)
        )

    @property
    def requester_key(self) -> str:
        """The canonical key of the session the tool call runs in."""
        return self._requester_key

    def check(self, target_key: str, action: Action) -> Verdict:
        """Decide whether the requester may ``action`` the session ``target_key``."""
        return check_visibility(
            self._config,
            action=action,
            requester_key=self._requester_key,
            target_key=target_key,
            visibility=self.visibility,
            spawned=self._spawned_for(target_key),
        )

    def _spawned_for(self, target_key: str) -> Collection[str]:
        """The spawned set when this check can use it, else an empty one (no lookup)."""
        if self.visibility != "tree" or target_key == self._requester_key:
            return frozenset()
        if self._spawned is None:
            self._spawned = frozenset(self._loader())
        return self._spawned
