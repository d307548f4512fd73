"""Which tools a sub-agent run gets: the full set minus the session tools (SPEC §7).

OpenClaw's rule (reference §7.3): every sub-agent loses ``sessions_send`` and
``agents_list`` (and the gateway/cron/status tools, when present); a *leaf* (depth at the
spawn limit) also loses ``sessions_list``, ``sessions_history``, ``sessions_spawn`` and
``subagents``, while an *orchestrator* (depth below the limit) keeps those to manage its
children. Here every tool flagged ``session_tool`` that is not one of those orchestration
tools is treated like ``sessions_send``, so a new session tool is denied by default.

``tools.subagents.tools`` then adjusts the result: ``allow`` and ``alsoAllow`` take names
off the deny list, ``deny`` adds to it, and a non-empty ``allow`` is also an allow list
(only matching tools remain). Names match case-insensitively and may be globs (``*``).
Pure: no Redis, no config loading.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

SubagentRole = Literal["main", "orchestrator", "leaf"]

# Denied to every sub-agent (OpenClaw names; most do not exist here).
ALWAYS_DENIED: tuple[str, ...] = (
    "gateway",
    "agents_list",
    "whatsapp_login",
    "session_status",
    "cron",
    "sessions_send",
)
# Kept by orchestrators, denied to leaves.
ORCHESTRATION_TOOLS: tuple[str, ...] = (
    "subagents",
    "sessions_list",
    "sessions_history",
    "sessions_spawn",
    "agents_wait",  # an orchestrator collects the collector children it spawned
    "sessions_yield",  # an orchestrator waits for its children (a leaf has none)
)


@dataclass(frozen=True)
class ToolRules:
    """The ``tools.subagents.tools`` lists."""

    allow: tuple[str, ...] = ()
    also_allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolInfo:
    """What the policy needs to know of a tool."""

    name: str
    session_tool: bool = False


def subagent_role(depth: int, max_spawn_depth: int, stored: str | None = None) -> SubagentRole:
    """The role of a session at ``depth``: the stored role wins when it is a known one."""
    if stored in ("main", "orchestrator", "leaf"):
        return stored  # type: ignore[return-value]
    if depth <= 0:
        return "main"
    return "orchestrator" if depth < max_spawn_depth else "leaf"


def base_denied(role: SubagentRole, tools: Iterable[ToolInfo]) -> set[str]:
    """Names denied to a role before the configured rules apply (none for ``main``)."""
    if role == "main":
        return set()
    kept = set(ORCHESTRATION_TOOLS) if role == "orchestrator" else set()
    denied = set(ALWAYS_DENIED)
    if role == "leaf":
        denied |= set(ORCHESTRATION_TOOLS)
    denied |= {t.name for t in tools if t.session_tool and t.name not in kept}
    return denied


def _matches(name: str, patterns: Iterable[str]) -> bool:
    lowered = name.lower()
    return any(fnmatchcase(lowered, p.strip().lower()) for p in patterns if p.strip())


def allowed_tools(
    role: SubagentRole, tools: Sequence[ToolInfo], rules: ToolRules = ToolRules()
) -> list[str]:
    """The names (in the given order) a session of ``role`` may use."""
    if role == "main":
        return [t.name for t in tools]
    explicit = (*rules.allow, *rules.also_allow)
    denied = {n for n in base_denied(role, tools) if not _matches(n, explicit)}
    out = []
    for tool in tools:
        if tool.name in denied or _matches(tool.name, rules.deny):
            continue
        if rules.allow and not _matches(tool.name, (*rules.allow, *rules.also_allow)):
            continue
        out.append(tool.name)
    return out


def passes(name: str, rules: ToolRules) -> bool:
    """Whether ``name`` passes one allow/deny layer (`tools.allow|deny`, an agent's
    `tools`): no ``deny`` glob matches it, and a non-empty ``allow`` (with ``alsoAllow``)
    matches it. Deny wins."""
    if _matches(name, rules.deny):
        return False
    return not rules.allow or _matches(name, (*rules.allow, *rules.also_allow))


def permitted(
    role: SubagentRole,
    tools: Sequence[ToolInfo],
    subagent_rules: ToolRules = ToolRules(),
    layers: Sequence[ToolRules] = (),
) -> list[str]:
    """The names (in order) a session may use: the sub-agent rules for its role, then
    every layer (the global `tools.allow|deny`, the agent's own) in turn."""
    names = allowed_tools(role, tools, subagent_rules)
    return [n for n in names if all(passes(n, rules) for rules in layers)]
