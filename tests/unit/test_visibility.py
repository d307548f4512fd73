"""Session visibility, the sandbox clamp and agent-to-agent policy (switchboard.shared.policy)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchboard.shared.config import SwitchboardConfig
from switchboard.shared.keys import agent_id_of
from switchboard.shared.policy.visibility import (
    Action,
    Verdict,
    Visibility,
    VisibilityGuard,
    a2a_allowed,
    check_visibility,
    effective_visibility,
    matches_allow,
    spawned_closure,
)

pytestmark = pytest.mark.unit

REQUESTER = "agent:main:main"
SAME_AGENT = "agent:main:discord:group:dev"
CROSS_AGENT = "agent:ops:main"
ACTIONS: tuple[Action, ...] = ("list", "history", "send", "status")
LEVELS: tuple[Visibility, ...] = ("self", "tree", "agent", "all")

CROSS_MSG = {
    "list": "Session list visibility is restricted. "
    "Set tools.sessions.visibility=all to allow cross-agent access; "
    "use tools.agentToAgent to restrict permitted agent pairs.",
    "history": "Session history visibility is restricted. "
    "Set tools.sessions.visibility=all to allow cross-agent access; "
    "use tools.agentToAgent to restrict permitted agent pairs.",
    "send": "Session send visibility is restricted. "
    "Set tools.sessions.visibility=all to allow cross-agent access; "
    "use tools.agentToAgent to restrict permitted agent pairs.",
    "status": "Session status visibility is restricted. "
    "Set tools.sessions.visibility=all to allow cross-agent access; "
    "use tools.agentToAgent to restrict permitted agent pairs.",
}
SELF_MSG = {
    "list": "Session list visibility is restricted to the current session "
    "(tools.sessions.visibility=self).",
    "history": "Session history visibility is restricted to the current session "
    "(tools.sessions.visibility=self).",
    "send": "Session send visibility is restricted to the current session "
    "(tools.sessions.visibility=self).",
    "status": "Session status visibility is restricted to the current session "
    "(tools.sessions.visibility=self).",
}
TREE_MSG = {
    "list": "Session list visibility is restricted to the current session tree "
    "(tools.sessions.visibility=tree).",
    "history": "Session history visibility is restricted to the current session tree "
    "(tools.sessions.visibility=tree).",
    "send": "Session send visibility is restricted to the current session tree "
    "(tools.sessions.visibility=tree).",
    "status": "Session status visibility is restricted to the current session tree "
    "(tools.sessions.visibility=tree).",
}
A2A_DISABLED_MSG = {
    "list": "Agent-to-agent listing is disabled. "
    "Set tools.agentToAgent.enabled=true to allow cross-agent visibility.",
    "history": "Agent-to-agent history is disabled. "
    "Set tools.agentToAgent.enabled=true to allow cross-agent access.",
    "send": "Agent-to-agent messaging is disabled. "
    "Set tools.agentToAgent.enabled=true to allow cross-agent sends.",
    "status": "Agent-to-agent status is disabled. "
    "Set tools.agentToAgent.enabled=true to allow cross-agent access.",
}
A2A_DENIED_MSG = {
    "list": "Agent-to-agent listing denied by tools.agentToAgent.allow.",
    "history": "Agent-to-agent history denied by tools.agentToAgent.allow.",
    "send": "Agent-to-agent messaging denied by tools.agentToAgent.allow.",
    "status": "Agent-to-agent session status denied by tools.agentToAgent.allow.",
}

OK = Verdict(allowed=True, status="ok", error=None)


def make_config(
    visibility: str = "tree",
    *,
    a2a: bool | None = None,
    allow: list[str] | None = None,
    sandbox: dict[str, Any] | None = None,
    agents: list[dict[str, Any]] | None = None,
) -> SwitchboardConfig:
    """A config with the given visibility, agent-to-agent policy and sandbox settings."""
    a2a_section: dict[str, Any] = {}
    if a2a is not None:
        a2a_section["enabled"] = a2a
    if allow is not None:
        a2a_section["allow"] = allow
    data: dict[str, Any] = {
        "tools": {"sessions": {"visibility": visibility}, "agentToAgent": a2a_section},
        "agents": {"defaults": {"sandbox": sandbox or {}}, "list": agents or []},
    }
    return SwitchboardConfig.model_validate(data)


def check(
    config: SwitchboardConfig,
    target: str,
    *,
    visibility: Visibility | None = None,
    action: Action = "history",
    spawned: Collection[str] = (),
) -> Verdict:
    """Run check_visibility for REQUESTER with the config's own visibility by default."""
    return check_visibility(
        config,
        action=action,
        requester_key=REQUESTER,
        target_key=target,
        visibility=visibility or config.tools.sessions.visibility,
        spawned=spawned,
    )


def forbidden(message: str) -> Verdict:
    """The forbidden verdict expected for a message."""
    return Verdict(allowed=False, status="forbidden", error=message)


# --- matches_allow and a2a_allowed ----------------------------------------------------------


@pytest.mark.parametrize(
    ("patterns", "agent_id", "expected"),
    [
        ([], "anything", True),
        (["*"], "ops", True),
        (["ops"], "ops", True),
        (["ops"], "opsx", False),
        (["Ops"], "ops", False),
        (["  ops  "], "ops", True),
        (["re*"], "research", True),
        (["RE*"], "research", True),
        (["*ops"], "devops", True),
        (["*ops"], "opsx", False),
        (["a*c"], "abbc", True),
        (["a*c"], "abbcd", False),
        (["a.b*"], "axb1", False),
        (["a.b*"], "a.b1", True),
        (["", "   "], "ops", False),
        (["agent:ops"], "ops", False),
        (["main", "ops"], "ops", True),
    ],
)
def test_matches_allow(patterns: list[str], agent_id: str, expected: bool) -> None:
    """Allow patterns: empty = any, `*`, exact case-sensitive ids, anchored case-free globs."""
    assert matches_allow(patterns, agent_id) is expected


def test_a2a_same_agent_is_always_allowed() -> None:
    """An agent reaches itself even with agent-to-agent disabled and a list excluding it."""
    assert a2a_allowed(make_config(a2a=False, allow=["other"]), "main", "main") is True


def test_a2a_disabled_by_default() -> None:
    """Without `tools.agentToAgent.enabled` two different agents may not reach each other."""
    assert a2a_allowed(make_config(), "main", "ops") is False


def test_a2a_enabled_with_empty_allow_lets_any_pair() -> None:
    """Enabled with no allow list, any two agents may reach each other."""
    assert a2a_allowed(make_config(a2a=True), "main", "ops") is True


@pytest.mark.parametrize(
    ("allow", "expected"),
    [(["main", "ops"], True), (["main"], False), (["ops"], False), (["m*", "o*"], True)],
)
def test_a2a_needs_both_ids_in_the_allow_list(allow: list[str], expected: bool) -> None:
    """Both the requester's and the target's agent id must match the allow list."""
    assert a2a_allowed(make_config(a2a=True, allow=allow), "main", "ops") is expected


# --- effective_visibility -------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_unsandboxed_sessions_get_the_configured_level(level: str) -> None:
    """Outside a sandbox the configured visibility applies unchanged."""
    assert effective_visibility(make_config(level), sandboxed=False) == level


@pytest.mark.parametrize("level", LEVELS)
def test_sandboxed_sessions_are_clamped_to_tree(level: str) -> None:
    """A sandboxed session (default `sessionToolsVisibility: spawned`) gets `tree`, even `self`."""
    assert effective_visibility(make_config(level), sandboxed=True) == "tree"


@pytest.mark.parametrize("level", LEVELS)
def test_sandbox_clamp_all_keeps_the_configured_level(level: str) -> None:
    """`sessionToolsVisibility: all` lifts the clamp for sandboxed sessions."""
    config = make_config(level, sandbox={"sessionToolsVisibility": "all"})
    assert effective_visibility(config, sandboxed=True) == level


def test_per_agent_sandbox_setting_decides_the_clamp() -> None:
    """An agent's own `sessionToolsVisibility` overrides the default for that agent only."""
    config = make_config(
        "all", agents=[{"id": "ops", "sandbox": {"sessionToolsVisibility": "all"}}]
    )
    assert effective_visibility(config, sandboxed=True, agent_id="ops") == "all"
    assert effective_visibility(config, sandboxed=True, agent_id="main") == "tree"


# --- check_visibility: the matrix -----------------------------------------------------------

A2A_CONFIGS: dict[str, dict[str, Any]] = {
    "disabled": {"a2a": False},
    "enabled": {"a2a": True},
    "glob-both": {"a2a": True, "allow": ["main", "o*"]},
    "glob-target-only": {"a2a": True, "allow": ["o*"]},
}


@pytest.mark.parametrize("a2a", A2A_CONFIGS)
@pytest.mark.parametrize("level", LEVELS)
def test_own_session_is_always_visible(level: Visibility, a2a: str) -> None:
    """The requester's own session is visible at every level and under every a2a policy."""
    assert check(make_config(level, **A2A_CONFIGS[a2a]), REQUESTER) == OK


@pytest.mark.parametrize("a2a", A2A_CONFIGS)
@pytest.mark.parametrize(
    ("level", "expected"),
    [
        ("self", forbidden(SELF_MSG["history"])),
        ("tree", forbidden(TREE_MSG["history"])),
        ("agent", OK),
        ("all", OK),
    ],
)
def test_same_agent_other_session(level: Visibility, expected: Verdict, a2a: str) -> None:
    """Another session of the same agent: only `agent` and `all` see it; a2a plays no part."""
    assert check(make_config(level, **A2A_CONFIGS[a2a]), SAME_AGENT) == expected


@pytest.mark.parametrize("a2a", A2A_CONFIGS)
@pytest.mark.parametrize("level", ["self", "tree", "agent"])
def test_cross_agent_below_all_is_forbidden(level: Visibility, a2a: str) -> None:
    """Below `all` a cross-agent target is refused naming tools.sessions.visibility."""
    verdict = check(make_config(level, **A2A_CONFIGS[a2a]), CROSS_AGENT)
    assert verdict == forbidden(CROSS_MSG["history"])


@pytest.mark.parametrize(
    ("a2a", "expected"),
    [
        ("disabled", forbidden(A2A_DISABLED_MSG["history"])),
        ("enabled", OK),
        ("glob-both", OK),
        ("glob-target-only", forbidden(A2A_DENIED_MSG["history"])),
    ],
)
def test_cross_agent_under_all_follows_a2a(a2a: str, expected: Verdict) -> None:
    """Under `all` a cross-agent target needs a2a enabled and both ids on the allow list."""
    assert check(make_config("all", **A2A_CONFIGS[a2a]), CROSS_AGENT) == expected


def test_cross_agent_exact_pattern_is_case_sensitive() -> None:
    """An allow entry `OPS` (no glob) does not admit agent `ops`."""
    config = make_config("all", a2a=True, allow=["main", "OPS"])
    assert check(config, CROSS_AGENT) == forbidden(A2A_DENIED_MSG["history"])


def test_cross_agent_glob_is_case_insensitive() -> None:
    """A glob entry `O*` admits agent `ops`."""
    config = make_config("all", a2a=True, allow=["MAIN*", "O*"])
    assert check(config, CROSS_AGENT) == OK


# --- exact messages per action --------------------------------------------------------------


@pytest.mark.parametrize("action", ACTIONS)
def test_messages_per_action(action: Action) -> None:
    """Each refusal carries OpenClaw's exact message for the action."""
    cases = [
        (make_config("self"), SAME_AGENT, SELF_MSG),
        (make_config("tree"), SAME_AGENT, TREE_MSG),
        (make_config("agent"), CROSS_AGENT, CROSS_MSG),
        (make_config("all"), CROSS_AGENT, A2A_DISABLED_MSG),
        (make_config("all", a2a=True, allow=["main"]), CROSS_AGENT, A2A_DENIED_MSG),
    ]
    for config, target, messages in cases:
        assert check(config, target, action=action) == forbidden(messages[action])


# --- tree and the spawned set ---------------------------------------------------------------

CHILD = "agent:main:subagent:11111111-1111-4111-8111-111111111111"
GRANDCHILD = "agent:main:subagent:22222222-2222-4222-8222-222222222222"
CROSS_CHILD = "agent:ops:subagent:33333333-3333-4333-8333-333333333333"


def test_tree_sees_transitive_children() -> None:
    """Under `tree` a grandchild in the spawned set is visible, an unrelated session is not."""
    config = make_config("tree")
    spawned = {CHILD, GRANDCHILD}
    assert check(config, GRANDCHILD, spawned=spawned) == OK
    assert check(config, CHILD, spawned=spawned) == OK
    assert check(config, SAME_AGENT, spawned=spawned) == forbidden(TREE_MSG["history"])


def test_tree_sees_cross_agent_spawned_child() -> None:
    """Fix vs OpenClaw: a child spawned into another agent is visible under `tree`."""
    config = make_config("tree", a2a=False)
    assert check(config, CROSS_CHILD, spawned={CROSS_CHILD}) == OK


def test_tree_still_refuses_cross_agent_outside_the_tree() -> None:
    """The fix admits only spawned sessions: other cross-agent sessions stay forbidden."""
    config = make_config("tree")
    verdict = check(config, CROSS_AGENT, spawned={CROSS_CHILD})
    assert verdict == forbidden(CROSS_MSG["history"])


@pytest.mark.parametrize(
    ("level", "target", "expected"),
    [
        ("self", CHILD, forbidden(SELF_MSG["history"])),
        ("self", CROSS_CHILD, forbidden(CROSS_MSG["history"])),
        ("agent", CROSS_CHILD, forbidden(CROSS_MSG["history"])),
        ("all", CROSS_CHILD, forbidden(A2A_DISABLED_MSG["history"])),
    ],
)
def test_spawned_set_only_counts_under_tree(
    level: Visibility, target: str, expected: Verdict
) -> None:
    """Outside `tree` membership in the spawned set grants nothing (as in the upstream fix)."""
    assert check(make_config(level), target, spawned={CHILD, CROSS_CHILD}) == expected


def test_spawned_closure_walks_every_generation() -> None:
    """spawned_closure collects children, grandchildren and beyond, without the root."""
    tree = {REQUESTER: [CHILD, CROSS_CHILD], CHILD: [GRANDCHILD], GRANDCHILD: ["leaf"]}
    found = spawned_closure(REQUESTER, lambda key: tree.get(key, []))
    assert found == {CHILD, CROSS_CHILD, GRANDCHILD, "leaf"}


def test_spawned_closure_survives_cycles() -> None:
    """A cycle in the spawn links (corrupt data) ends instead of looping forever."""
    tree = {"a": ["b"], "b": ["c", "a"], "c": ["b"]}
    assert spawned_closure("a", lambda key: tree.get(key, [])) == {"b", "c"}


# --- VisibilityGuard ------------------------------------------------------------------------


class CountingLoader:
    """A spawned-set loader that records how often it was called."""

    def __init__(self, keys: Collection[str]) -> None:
        self.keys = keys
        self.calls = 0

    def __call__(self) -> Collection[str]:
        self.calls += 1
        return self.keys


def make_guard(
    config: SwitchboardConfig, loader: CountingLoader, *, sandboxed: bool = False
) -> VisibilityGuard:
    """A guard for REQUESTER over the given config and loader."""
    return VisibilityGuard(
        config, requester_key=REQUESTER, sandboxed=sandboxed, spawned_loader=loader
    )


def test_guard_loads_spawned_set_once_under_tree() -> None:
    """Under `tree` the loader runs once however many targets are checked."""
    loader = CountingLoader({CHILD})
    guard = make_guard(make_config("tree"), loader)
    assert guard.check(CHILD, "history") == OK
    assert guard.check(SAME_AGENT, "send") == forbidden(TREE_MSG["send"])
    assert guard.check(CHILD, "status") == OK
    assert loader.calls == 1


@pytest.mark.parametrize("level", ["self", "agent", "all"])
def test_guard_never_loads_outside_tree(level: str) -> None:
    """Outside `tree` the spawned set is never looked up."""
    loader = CountingLoader({CHILD})
    guard = make_guard(make_config(level), loader)
    guard.check(SAME_AGENT, "list")
    guard.check(CROSS_AGENT, "list")
    assert loader.calls == 0


def test_guard_skips_loading_for_own_session() -> None:
    """Checking the requester's own session needs no lookup."""
    loader = CountingLoader(set())
    assert make_guard(make_config("tree"), loader).check(REQUESTER, "history") == OK
    assert loader.calls == 0


def test_guard_applies_sandbox_clamp() -> None:
    """A sandboxed requester under `all` is clamped to `tree` and checks the spawned set."""
    loader = CountingLoader({CHILD})
    guard = make_guard(make_config("all", a2a=True), loader, sandboxed=True)
    assert guard.visibility == "tree"
    assert guard.check(CHILD, "history") == OK
    assert guard.check(CROSS_AGENT, "history") == forbidden(CROSS_MSG["history"])
    assert guard.check(SAME_AGENT, "history") == forbidden(TREE_MSG["history"])


def test_guard_sandbox_clamp_uses_requester_agent() -> None:
    """The clamp follows the requester agent's own sandbox settings."""
    config = make_config(
        "agent", agents=[{"id": "main", "sandbox": {"sessionToolsVisibility": "all"}}]
    )
    guard = make_guard(config, CountingLoader(set()), sandboxed=True)
    assert guard.visibility == "agent"
    assert guard.check(SAME_AGENT, "list") == OK


def test_guard_propagates_loader_errors() -> None:
    """A failing lookup is an error for the caller, not a silent "forbidden"."""

    def broken() -> Collection[str]:
        raise ConnectionError("store down")

    guard = VisibilityGuard(
        make_config("tree"), requester_key=REQUESTER, sandboxed=False, spawned_loader=broken
    )
    with pytest.raises(ConnectionError):
        guard.check(CHILD, "history")


# --- property -------------------------------------------------------------------------------

agent_ids = st.sampled_from(["main", "ops", "research", "Ops-2", "x"])
session_keys = st.builds(
    lambda agent, rest: f"agent:{agent.lower()}:{rest}",
    agent_ids,
    st.sampled_from(["main", "discord:group:dev", "subagent:1", "cron:job"]),
)
allow_lists = st.lists(st.sampled_from(["*", "main", "ops", "o*", "R*", "", "Ops-2"]), max_size=3)


@given(
    requester=session_keys,
    target=session_keys,
    level=st.sampled_from(LEVELS),
    enabled=st.booleans(),
    allow=allow_lists,
    spawned=st.sets(session_keys, max_size=4),
    action=st.sampled_from(ACTIONS),
)
def test_cross_agent_needs_all_and_a2a_or_the_spawned_tree(
    requester: str,
    target: str,
    level: Visibility,
    enabled: bool,
    allow: list[str],
    spawned: set[str],
    action: Action,
) -> None:
    """A cross-agent target is allowed only under `all` with a2a allowing both, or if spawned."""
    config = make_config(level, a2a=enabled, allow=allow)
    verdict = check_visibility(
        config,
        action=action,
        requester_key=requester,
        target_key=target,
        visibility=level,
        spawned=spawned,
    )
    assert (verdict.error is None) is verdict.allowed
    assert verdict.status == ("ok" if verdict.allowed else "forbidden")
    requester_agent, target_agent = agent_id_of(requester), agent_id_of(target)
    if verdict.allowed and requester_agent != target_agent:
        by_policy = (
            level == "all"
            and enabled
            and matches_allow(allow, requester_agent)
            and matches_allow(allow, target_agent)
        )
        assert by_policy or (level == "tree" and target in spawned)
