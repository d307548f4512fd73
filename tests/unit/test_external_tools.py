"""MCP and Python tools, the pure parts: OpenClaw's naming rules, tool filters, the
allow/deny layers of the policy, the result cut, and the entry-point shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic_ai.toolsets import FunctionToolset

from switchboard.shared.config import ConfigError, SwitchboardConfig, load_config
from switchboard.shared.policy.tool_policy import ToolInfo, ToolRules, permitted
from switchboard.shared.runtime.external_tools import MAX_RESULT_CHARS, bounded
from switchboard.shared.runtime.python_tools import as_toolset
from switchboard.shared.runtime.tool_limits import FleetLimitedToolset, server_label
from switchboard.shared.runtime.tool_names import assign_names, passes_filter, prefix

pytestmark = pytest.mark.unit


def test_the_server_part_is_cleaned_and_cut_at_30() -> None:
    """Characters outside [A-Za-z0-9_-] become '-', and the server part is at most 30."""
    assert prefix("my server.v2") == "my-server-v2"
    assert prefix("x" * 40) == "x" * 30


def test_names_are_at_most_64_and_collisions_get_a_suffix() -> None:
    """`<server>__<tool>`, cut at 64; a name taken already gets -2, then -3."""
    names = assign_names([("a.b", ["t"]), ("a b", ["t"]), ("a-b", ["t"]), ("s", ["y" * 80])])
    assert list(names)[:3] == ["a-b__t", "a-b__t-2", "a-b__t-3"]
    assert names["a-b__t-2"] == ("a b", "t")
    long = list(names)[3]
    assert len(long) == 64 and long.startswith("s__yyy")


def test_a_tool_filter_includes_then_excludes() -> None:
    """`include` (when any) must match, and no `exclude` may."""
    assert passes_filter("read_note", ["read_*"], [])
    assert not passes_filter("write_note", ["read_*"], [])
    assert not passes_filter("read_secret", ["read_*"], ["*secret*"])
    assert passes_filter("anything", [], [])


MCP = [ToolInfo("notes__add"), ToolInfo("notes__delete"), ToolInfo("web__fetch")]
SESSION = [ToolInfo("sessions_send", session_tool=True), ToolInfo("sessions_list", True)]


def test_global_and_agent_layers_apply_to_every_tool() -> None:
    """`tools.deny` globs drop MCP and session tools; an agent's `allow` keeps only matches."""
    deny = ToolRules(deny=("notes__del*", "sessions_send"))
    assert permitted("main", [*SESSION, *MCP], layers=[deny]) == [
        "sessions_list",
        "notes__add",
        "web__fetch",
    ]
    agent = ToolRules(allow=("web__*",), also_allow=("sessions_list",))
    assert permitted("main", [*SESSION, *MCP], layers=[deny, agent]) == [
        "sessions_list",
        "web__fetch",
    ]


def test_sub_agents_keep_mcp_tools_and_lose_the_session_tools() -> None:
    """A leaf keeps the MCP tools, minus what `tools.subagents.tools.deny` names."""
    rules = ToolRules(deny=("web__*",))
    assert permitted("leaf", [*SESSION, *MCP], rules) == ["notes__add", "notes__delete"]


def test_a_long_result_is_cut_with_a_marker() -> None:
    """Past MAX_RESULT_CHARS the result is text cut there, with the marker saying so."""
    small, cut = bounded({"a": 1})
    assert small == {"a": 1} and cut is False
    big, cut = bounded("x" * (MAX_RESULT_CHARS + 10))
    assert cut is True and big.startswith("x" * MAX_RESULT_CHARS)
    assert big.endswith(f"(result cut at {MAX_RESULT_CHARS} of {MAX_RESULT_CHARS + 10} characters)")


def test_entry_points_may_hold_a_toolset_a_function_or_functions() -> None:
    """Each shape becomes a toolset; anything else is refused."""

    def one(x: int) -> int:
        """Double x."""
        return 2 * x

    toolset = FunctionToolset([one])
    assert as_toolset(toolset) is toolset
    assert list(as_toolset(one).tools) == ["one"]  # type: ignore[attr-defined]
    assert list(as_toolset([one]).tools) == ["one"]  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        as_toolset(42)


def test_an_mcp_server_needs_a_command_or_a_url() -> None:
    """stdio without `command` and HTTP without `url` are config errors; a url alone is SSE."""
    with pytest.raises(ConfigError, match="needs a `command`"):
        SwitchboardConfig.model_validate({"mcp": {"servers": {"a": {"args": ["x"]}}}})
    with pytest.raises(ConfigError, match="needs a `url`"):
        SwitchboardConfig.model_validate(
            {"mcp": {"servers": {"a": {"transport": "streamable-http"}}}}
        )
    config = SwitchboardConfig.model_validate({"mcp": {"servers": {"a": {"url": "http://h/sse"}}}})
    assert config.mcp.servers["a"].kind == "sse"


def test_the_example_config_loads() -> None:
    """examples/mcp/switchboard.json5 is a valid config with its two servers."""
    config = load_config(Path(__file__).resolve().parents[2] / "examples/mcp/switchboard.json5")
    servers = config.mcp.servers
    assert servers["notes"].kind == "stdio" and servers["notes-http"].kind == "streamable-http"


def test_a_server_name_becomes_a_safe_label_for_its_slots_and_metrics() -> None:
    """A plain name is its own label; any other becomes a distinct plain one (the limiter
    and the metrics accept it), so OpenClaw's names with spaces still work."""
    assert server_label("notes") == "notes"
    odd = [server_label(n) for n in ("my server", "my.server", "my{server}", "日本", "x" * 300)]
    assert len(set(odd)) == len(odd)
    assert odd[1] == "my.server"
    for label in odd:
        FleetLimitedToolset(FunctionToolset(), server=label)  # accepted as a server name
