"""The sub-agent tool policy (switchboard.shared.policy.tool_policy) and the tool offer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest

from switchboard.shared.policy.tool_policy import (
    ToolInfo,
    ToolRules,
    allowed_tools,
    base_denied,
    subagent_role,
)
from switchboard.shared.services import Services, ToolContext, ToolRegistry, ToolSpec
from switchboard.shared.tools.catalog import ALL_TOOLS, register_session_tools
from switchboard.shared.tools.offer import tools_for_session

pytestmark = pytest.mark.unit

SESSION_TOOLS = ("sessions_list", "sessions_history", "sessions_send", "sessions_spawn")
TOOLS = [
    *(ToolInfo(name, session_tool=True) for name in SESSION_TOOLS),
    ToolInfo("agents_list", session_tool=True),
    ToolInfo("web_search"),
    ToolInfo("read_file"),
    ToolInfo("cron"),
]


def test_role_from_depth_and_limit() -> None:
    """Depth 0 is main; below the limit orchestrator; at or beyond it leaf."""
    assert subagent_role(0, 1) == "main"
    assert subagent_role(1, 1) == "leaf"
    assert subagent_role(1, 2) == "orchestrator"
    assert subagent_role(2, 2) == "leaf"
    assert subagent_role(3, 2) == "leaf"


def test_stored_role_wins_over_depth() -> None:
    """A stored subagentRole is used as is; an unknown stored value is ignored."""
    assert subagent_role(1, 1, stored="orchestrator") == "orchestrator"
    assert subagent_role(1, 3, stored="leaf") == "leaf"
    assert subagent_role(1, 3, stored="boss") == "orchestrator"


def test_main_sessions_keep_every_tool() -> None:
    """The policy removes nothing outside sub-agents."""
    assert allowed_tools("main", TOOLS) == [t.name for t in TOOLS]
    assert base_denied("main", TOOLS) == set()


def test_leaf_loses_every_session_tool() -> None:
    """A leaf gets the full set minus all session tools (and OpenClaw's always-denied)."""
    assert allowed_tools("leaf", TOOLS) == ["web_search", "read_file"]


def test_orchestrator_keeps_list_history_and_spawn() -> None:
    """An orchestrator keeps the tools to manage children, never send or agents_list."""
    assert allowed_tools("orchestrator", TOOLS) == [
        "sessions_list",
        "sessions_history",
        "sessions_spawn",
        "web_search",
        "read_file",
    ]


def test_unknown_session_tools_are_denied_to_orchestrators_too() -> None:
    """A session tool outside the orchestration set is treated like sessions_send."""
    tools = [ToolInfo("sessions_future", session_tool=True), ToolInfo("web_search")]
    assert allowed_tools("orchestrator", tools) == ["web_search"]


def test_allow_and_also_allow_take_names_off_the_deny_list() -> None:
    """alsoAllow re-enables a denied tool without narrowing the rest."""
    rules = ToolRules(also_allow=("sessions_send",))
    assert allowed_tools("leaf", TOOLS, rules) == ["sessions_send", "web_search", "read_file"]


def test_non_empty_allow_is_an_allow_list() -> None:
    """With `allow`, only matching tools remain (alsoAllow merges into it)."""
    rules = ToolRules(allow=("sessions_history", "web_*"), also_allow=("read_file",))
    assert allowed_tools("leaf", TOOLS, rules) == ["sessions_history", "web_search", "read_file"]


def test_deny_adds_and_wins_over_allow() -> None:
    """`deny` removes tools (globs, any case), even ones `allow` names."""
    rules = ToolRules(allow=("web_search", "read_file"), deny=("READ_*",))
    assert allowed_tools("leaf", TOOLS, rules) == ["web_search"]


def test_always_denied_names_stay_denied_without_a_rule() -> None:
    """OpenClaw's gateway-level tools (cron here) are denied to every sub-agent."""
    assert "cron" not in allowed_tools("orchestrator", TOOLS)
    assert "cron" in allowed_tools("leaf", TOOLS, ToolRules(also_allow=("cron",)))


# --- the offer: which registered tools a session gets (ToolRegistry.offered) ---------------


def _spec(name: str) -> ToolSpec:
    return ToolSpec(name=name, description=name, parameters={}, handler=lambda _c, _a: {})


def _ctx() -> ToolContext:
    # The offer is handed the context's services as they are; nothing here reads them.
    return ToolContext(
        services=cast(Services, object()), session_key="agent:main:main", agent_id="main"
    )


def test_a_registry_without_an_offer_offers_every_tool() -> None:
    """No offer installed: every registered tool, in registry order."""
    registry = ToolRegistry()
    registry.register(_spec("b"))
    registry.register(_spec("a"))
    assert [s.name for s in registry.offered(_ctx())] == ["b", "a"]


def test_offered_asks_the_installed_offer_with_the_services_context_and_session() -> None:
    """An installed offer decides, given the context's services, the context and the entry."""
    seen: list[tuple[object, ToolContext, Mapping[str, Any] | None]] = []

    def only_a(
        svc: Services, ctx: ToolContext, session: Mapping[str, Any] | None
    ) -> list[ToolSpec]:
        seen.append((svc, ctx, session))
        return [s for s in ctx_registry.tools.values() if s.name == "a"]

    ctx_registry = ToolRegistry(offer=only_a)
    ctx_registry.register(_spec("a"))
    ctx_registry.register(_spec("b"))
    ctx = _ctx()
    assert [s.name for s in ctx_registry.offered(ctx, {"subagentRole": "leaf"})] == ["a"]
    assert seen == [(ctx.services, ctx, {"subagentRole": "leaf"})]


def test_the_session_catalog_installs_the_sub_agent_offer() -> None:
    """register_session_tools adds every session tool and the sub-agent rule with them."""
    registry = register_session_tools(ToolRegistry())
    assert registry.offer is tools_for_session
    assert registry.names() == sorted(spec.name for spec in ALL_TOOLS)


NINE_SIX = [
    ToolInfo(name)
    for name in (
        "gateway",
        "message",
        "automations",
        "conversations_list",
        "conversations_read",
        "memory_search",
        "web_search",
    )
]


def test_openclaw_2026_9_6_always_denied_list() -> None:
    """Every sub-agent loses gateway, message, automations and conversations_*; memory
    tools are no longer denied."""
    for role in ("orchestrator", "leaf"):
        assert allowed_tools(role, NINE_SIX) == ["memory_search", "web_search"]  # type: ignore[arg-type]
    rules = ToolRules(also_allow=("conversations_read",))
    assert "conversations_read" in allowed_tools("leaf", NINE_SIX, rules)


def test_leaves_lose_sessions_search_and_orchestrators_keep_it() -> None:
    """sessions_search is an orchestration tool: a leaf loses it, an orchestrator keeps it."""
    tools = [ToolInfo("sessions_search", session_tool=True), ToolInfo("web_search")]
    assert allowed_tools("leaf", tools) == ["web_search"]
    assert allowed_tools("orchestrator", tools) == ["sessions_search", "web_search"]
