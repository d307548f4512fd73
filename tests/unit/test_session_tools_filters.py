"""Pure parts of `sessions_list`'s filters, the default visibility, and who is offered
`session_status` (no Redis: entries and configs are built in memory)."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.shared.config import SwitchboardConfig
from switchboard.shared.errors import InvalidInput
from switchboard.shared.policy.tool_policy import ToolInfo, allowed_tools
from switchboard.shared.policy.visibility import (
    VisibilityGuard,
    a2a_denied_message,
    a2a_disabled_message,
    effective_visibility,
)
from switchboard.shared.store.sessions import SessionEntry
from switchboard.shared.tools.catalog import ALL_TOOLS
from switchboard.shared.tools.sessions_list import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    ListQuery,
    read_query,
    search_hit,
)

pytestmark = pytest.mark.unit


def entry(key: str, updated: int = 1_000, **fields: Any) -> SessionEntry:
    """A session entry as the store would decode it."""
    return SessionEntry(key=key, fields={"updatedAt": updated, "sessionId": "sid-1", **fields})


def no_names() -> list[str]:
    """A `names` callback that must not be called (no search in the query)."""
    raise AssertionError("names read without a search")


# --- read_query ------------------------------------------------------------------------------


def test_read_query_defaults_leave_every_filter_off() -> None:
    """No arguments: default limit, no label, agent or search."""
    query = read_query({})
    assert (query.limit, query.label, query.agent_id, query.search) == (
        DEFAULT_LIMIT,
        None,
        None,
        None,
    )
    assert query.filters_rows is False


def test_read_query_normalises_the_new_filters() -> None:
    """Label kept as given (exact match), agentId lower-cased, search lower-cased; blank
    strings count as absent; snake_case spellings work too."""
    query = read_query({"label": " Nightly-Build ", "agentId": "OPS", "search": " PlanNing "})
    assert (query.label, query.agent_id, query.search) == ("Nightly-Build", "ops", "planning")
    assert query.filters_rows is True
    assert read_query({"label": "  ", "agent_id": "Dev"}).label is None
    assert read_query({"agent_id": "Dev"}).agent_id == "dev"
    assert read_query({"limit": 10_000}).limit == MAX_LIMIT


def test_read_query_refuses_bad_filter_values() -> None:
    """agentId over 64 characters, or a non-string filter, is invalid input."""
    with pytest.raises(InvalidInput, match="agentId must be at most 64 characters"):
        read_query({"agentId": "a" * 65})
    assert read_query({"agentId": "a" * 64}).agent_id == "a" * 64
    with pytest.raises(InvalidInput, match="search must be a string"):
        read_query({"search": 5})
    with pytest.raises(InvalidInput, match="label must be a string"):
        read_query({"label": ["x"]})


# --- ListQuery.accepts -------------------------------------------------------------------------


def test_label_filter_is_an_exact_match() -> None:
    """Same text only: case and missing labels count as a mismatch."""
    query = ListQuery(kinds=None, limit=5, min_updated_ms=None, message_limit=0, label="Build")
    assert query.accepts(entry("agent:main:cron:a", label="Build"), "cron", no_names)
    assert not query.accepts(entry("agent:main:cron:a", label="build"), "cron", no_names)
    assert not query.accepts(entry("agent:main:cron:a"), "cron", no_names)


def test_agent_filter_compares_the_keys_agent() -> None:
    """The agent id of the key decides; non-agent keys belong to the default agent."""
    query = ListQuery(kinds=None, limit=5, min_updated_ms=None, message_limit=0, agent_id="ops")
    assert query.accepts(entry("agent:ops:main"), "main", no_names)
    assert not query.accepts(entry("agent:main:main"), "main", no_names)
    assert not query.accepts(entry("agent:opsx:main"), "main", no_names)


def test_search_looks_in_the_names_case_insensitively() -> None:
    """A substring of any of the names, whatever their case."""
    query = ListQuery(kinds=None, limit=5, min_updated_ms=None, message_limit=0, search="plan")
    session = entry("agent:main:hook:x")
    assert query.accepts(session, "hook", lambda: ["agent:main:hook:x", "Release PLANNING"])
    assert not query.accepts(session, "hook", lambda: ["agent:main:hook:x", ""])
    assert search_hit("dev", ["", "discord:g-DEV"])
    assert not search_hit("dev", [])


def test_every_filter_must_hold() -> None:
    """Kind, activity, label, agent and search combine with AND."""
    query = ListQuery(
        kinds=frozenset({"cron"}),
        limit=5,
        min_updated_ms=500,
        message_limit=0,
        label="L",
        agent_id="main",
        search="job",
    )
    good = entry("agent:main:cron:job", updated=600, label="L")
    names = lambda: ["agent:main:cron:job"]  # noqa: E731
    assert query.accepts(good, "cron", names)
    assert not query.accepts(good, "hook", names)
    assert not query.accepts(entry("agent:main:cron:job", updated=400, label="L"), "cron", names)
    assert not query.accepts(entry("agent:ops:cron:job", updated=600, label="L"), "cron", names)
    assert not query.accepts(good, "cron", lambda: ["agent:main:cron:other"])


# --- the default visibility (OpenClaw PR #133469) ----------------------------------------------


def test_default_visibility_is_agent() -> None:
    """No setting: `agent` (every session of the caller's agent), not `tree`."""
    config = SwitchboardConfig()
    assert config.tools.sessions.visibility == "agent"
    assert effective_visibility(config, sandboxed=False) == "agent"
    guard = VisibilityGuard(
        config, requester_key="agent:main:main", sandboxed=False, spawned_loader=lambda: ()
    )
    assert guard.check("agent:main:cron:other", "status").allowed
    assert not guard.check("agent:ops:main", "status").allowed


def test_sandboxed_sessions_are_still_clamped_to_tree_by_default() -> None:
    """The sandbox clamp (`sessionToolsVisibility: spawned`) is unchanged by the new default."""
    config = SwitchboardConfig()
    assert effective_visibility(config, sandboxed=True) == "tree"
    guard = VisibilityGuard(
        config,
        requester_key="agent:main:main",
        sandboxed=True,
        spawned_loader=lambda: {"agent:main:subagent:kid"},
    )
    assert guard.check("agent:main:subagent:kid", "list").allowed
    assert not guard.check("agent:main:cron:other", "list").allowed


def test_status_refusal_texts_are_openclaws() -> None:
    """The agent-to-agent refusals `session_status` gives, word for word."""
    assert a2a_disabled_message("status") == (
        "Agent-to-agent status is disabled. "
        "Set tools.agentToAgent.enabled=true to allow cross-agent access."
    )
    assert a2a_denied_message("status") == (
        "Agent-to-agent session status denied by tools.agentToAgent.allow."
    )


# --- session_status is never offered to sub-agents -------------------------------------------


def test_session_status_is_in_the_catalog_and_denied_to_every_sub_agent_role() -> None:
    """Main sessions get it; orchestrators and leaves do not."""
    infos = [ToolInfo(spec.name, spec.session_tool) for spec in ALL_TOOLS]
    assert "session_status" in {info.name for info in infos}
    assert "session_status" in allowed_tools("main", infos)
    assert "session_status" not in allowed_tools("orchestrator", infos)
    assert "session_status" not in allowed_tools("leaf", infos)
