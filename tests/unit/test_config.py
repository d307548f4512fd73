"""The JSON5 config (OpenClaw's shape), its errors and warnings, and the env settings."""

from __future__ import annotations

import logging
import os
import unittest
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from switchboard.shared.config import (
    BUILTIN_MODEL,
    ConfigError,
    EffectiveSubagents,
    Settings,
    SwitchboardConfig,
    get_config,
    get_settings,
    load_config,
    parse_config,
    reset_caches,
)
from switchboard.shared.errors import InvalidInput

pytestmark = pytest.mark.unit

OPENCLAW_CONFIG = """
// An OpenClaw config: comments, unquoted keys, trailing commas, keys we do not read.
{
  session: {
    mainKey: " Primary ",
    scope: "per-sender",
    dmScope: "main",
    agentToAgent: { maxPingPongTurns: 2 },
    sendPolicy: {
      default: "allow",
      rules: [{ action: "deny", match: { channel: "discord", chatType: "group" } }],
    },
  },
  tools: {
    sessions: { visibility: "Agent" },
    agentToAgent: { enabled: true, allow: ["home", "work*"] },
    subagents: { tools: { deny: ["browser"], alsoAllow: ["sessions_list"] } },
  },
  agents: {
    defaults: {
      model: { primary: "anthropic/claude-sonnet-4", fallbacks: ["openai/gpt-4o"] },
      sandbox: { mode: "non-main", sessionToolsVisibility: "all" },
      subagents: { maxSpawnDepth: 2, maxChildrenPerAgent: 8, runTimeoutSeconds: 900,
                   allowAgents: ["work"], model: "openai/gpt-4o-mini" },
      userTimezone: "Europe/Paris",
      workspace: "~/.openclaw/workspace",
    },
    list: [
      { id: "Home", default: true, name: "Home" },
      { id: "work", model: "openai/gpt-4o", subagents: { allowAgents: ["*"] } },
    ],
  },
  models: {
    providers: {
      local: { baseUrl: "http://127.0.0.1:11434/v1", apiKey: "ollama", api: "openai-completions",
               models: [{ id: "llama3", name: "Llama 3" }] },
    },
  },
  channels: {
    telegram: { botToken: "123:abc", dmPolicy: "pairing",
                webhook: { url: "https://bridge.example/telegram", headers: { "X-Key": "s" } } },
  },
  gateway: { port: 18789, auth: { mode: "token", token: "t0ken" } },
}
"""


def _nested(path: tuple[str, ...], value: object) -> dict[str, Any]:
    """`("a", "b"), 1` → `{"a": {"b": 1}}`."""
    data: Any = value
    for key in reversed(path):
        data = {key: data}
    result: dict[str, Any] = data
    return result


def _quiet(data: dict[str, Any]) -> SwitchboardConfig:
    """Parse a config, failing the test if it warns."""
    with unittest.TestCase().assertNoLogs("switchboard.config", logging.WARNING):
        return parse_config(data)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The config warnings logged so far."""
    return [r.getMessage() for r in caplog.records if r.name == "switchboard.config"]


@pytest.fixture
def openclaw_file(tmp_path: Path) -> Path:
    """A JSON5 file holding an OpenClaw-shaped config."""
    path = tmp_path / "openclaw.json5"
    path.write_text(OPENCLAW_CONFIG, encoding="utf-8")
    return path


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The environment without SWITCHBOARD_* variables, and empty getter caches."""
    for name in list(os.environ):
        if name.startswith("SWITCHBOARD_"):
            monkeypatch.delenv(name)
    reset_caches()
    yield monkeypatch
    reset_caches()


# --- defaults and loading -----------------------------------------------------------------


def test_empty_config_means_all_defaults() -> None:
    """`{}` validates and every section takes its documented default."""
    config = _quiet({})
    assert config.session.main_key == "main"
    assert config.session.scope == "per-sender"
    assert config.session.send_policy is None
    assert config.session.agent_to_agent.max_ping_pong_turns == 5
    assert config.tools.sessions.visibility == "agent"
    assert config.tools.agent_to_agent.enabled is False
    assert config.agents.defaults.sandbox.mode == "off"
    assert config.agents.defaults.sandbox.session_tools_visibility == "spawned"
    subagents = config.agents.defaults.subagents
    assert (subagents.max_spawn_depth, subagents.max_children_per_agent) == (1, 5)
    assert (subagents.archive_after_minutes, subagents.announce_timeout_ms) == (60, 120_000)
    assert config.agents.defaults.user_timezone == "UTC"
    assert (config.runs.retention_hours, config.runs.timeout_seconds) == (24, 600)
    assert config.runs.max_attempts == 3
    assert config.delivery.max_attempts == 5
    assert config.channels == {}


def test_no_path_loads_defaults() -> None:
    """`load_config(None)` is the all-defaults config."""
    assert load_config(None) == SwitchboardConfig()


def test_openclaw_file_loads_unchanged(
    openclaw_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An OpenClaw JSON5 file with camelCase keys loads into the snake_case attributes."""
    config = load_config(openclaw_file)
    assert _warnings(caplog)  # OpenClaw's own keys that Switchboard does not use
    assert config.session.main_key == "primary"
    assert config.session.agent_to_agent.max_ping_pong_turns == 2
    assert config.session.send_policy is not None
    rule = config.session.send_policy.rules[0]
    assert rule.action == "deny"
    assert rule.match is not None and rule.match.chat_type == "group"
    assert config.tools.sessions.visibility == "agent"
    assert config.tools.agent_to_agent.allow == ["home", "work*"]
    assert config.tools.subagents.tools.also_allow == ["sessions_list"]
    assert config.agents.defaults.model_ref == "anthropic/claude-sonnet-4"
    assert config.agents.defaults.subagents.run_timeout_seconds == 900
    assert config.agent_ids() == ["home", "work"]
    provider = config.models.providers["local"]
    assert provider.base_url == "http://127.0.0.1:11434/v1"
    assert provider.api_key == "ollama"
    assert provider.models[0].name == "Llama 3"
    webhook = config.channels["telegram"].webhook
    assert webhook is not None and webhook.url == "https://bridge.example/telegram"
    assert config.gateway.auth.token == "t0ken"


def test_snake_case_names_are_accepted() -> None:
    """Attribute names work as keys too, so Python callers can build configs."""
    config = _quiet({"session": {"main_key": "home", "agent_to_agent": {"max_ping_pong_turns": 1}}})
    assert config.session.main_key == "home"
    assert config.session.agent_to_agent.max_ping_pong_turns == 1


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A path that does not exist names the path."""
    missing = tmp_path / "nope.json5"
    with pytest.raises(ConfigError, match=r"^config file not found: ") as caught:
        load_config(missing)
    assert str(missing) in str(caught.value)


def test_json5_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    """A syntax error reports where it is."""
    path = tmp_path / "bad.json5"
    path.write_text('{\n  session: {\n    mainKey: "x" "y"\n  }\n}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"line 3, column \d+") as caught:
        load_config(path)
    assert caught.value.fields["line"] == 3


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    """A JSON5 array at the top level is rejected."""
    path = tmp_path / "list.json5"
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ConfigError, match="top level must be an object, not an array"):
        load_config(path)


def test_config_error_is_invalid_input() -> None:
    """The API maps ConfigError like any InvalidInput."""
    assert issubclass(ConfigError, InvalidInput)


def test_config_is_immutable() -> None:
    """The cached config is shared, so it cannot be changed in place."""
    config = parse_config({})
    with pytest.raises(ValidationError):
        config.session.scope = "global"


# --- unknown keys -------------------------------------------------------------------------


def test_unknown_key_warns_with_dotted_path(caplog: pytest.LogCaptureFixture) -> None:
    """An unknown key is ignored with a log line naming its dotted path."""
    config = parse_config({"session": {"fooBar": 1, "scope": "global"}})
    assert _warnings(caplog) == ["unknown config key: session.fooBar"]
    assert caplog.records[-1].levelno == logging.WARNING
    assert config.session.scope == "global"


def test_a_near_miss_names_the_key_it_resembles(caplog: pytest.LogCaptureFixture) -> None:
    """A misspelt key says which declared key it is closest to."""
    parse_config({"session": {"mainkey": "x"}, "tools": {"sesions": {}}})
    assert sorted(_warnings(caplog)) == [
        "unknown config key: session.mainkey (did you mean session.mainKey?)",
        "unknown config key: tools.sesions (did you mean tools.sessions?)",
    ]


def test_unknown_keys_in_lists_and_maps_are_located(caplog: pytest.LogCaptureFixture) -> None:
    """Paths through lists and maps show the index and the map key."""
    data = {
        "agents": {"list": [{"id": "a"}, {"id": "b", "workspace": "/w"}]},
        "models": {"providers": {"local": {"headers": {}}}},
        "zzTop": True,
    }
    parse_config(data)
    assert sorted(_warnings(caplog)) == [
        "unknown config key: agents.list[1].workspace",
        "unknown config key: models.providers.local.headers",
        "unknown config key: zzTop",
    ]


def test_channel_platform_keys_are_silent() -> None:
    """Channels carry many platform keys; those do not warn."""
    config = _quiet({"channels": {"whatsapp": {"allowFrom": ["+1"], "groups": {"*": {}}}}})
    assert config.channels["whatsapp"].webhook is None


def test_unknown_key_inside_webhook_warns(caplog: pytest.LogCaptureFixture) -> None:
    """The webhook itself is ours, so its unknown keys do warn."""
    data = {"channels": {"slack": {"webhook": {"url": "http://h.test/x", "retry": 3}}}}
    parse_config(data)
    assert _warnings(caplog) == ["unknown config key: channels.slack.webhook.retry"]


# --- invalid values -----------------------------------------------------------------------


def test_invalid_value_names_path_value_and_rule() -> None:
    """The message names the dotted key, the bad value and the constraint."""
    with pytest.raises(ConfigError) as caught:
        parse_config({"session": {"agentToAgent": {"maxPingPongTurns": 9}}})
    assert str(caught.value) == (
        "invalid config: session.agentToAgent.maxPingPongTurns = 9: must be between 0 and 5"
    )
    assert caught.value.key_path == "session.agentToAgent.maxPingPongTurns"


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"session": {"scope": "everyone"}}, "session.scope"),
        ({"session": {"sendPolicy": {"default": "maybe"}}}, "session.sendPolicy.default"),
        (
            {"session": {"sendPolicy": {"rules": [{"match": {"chatType": "thread"}}]}}},
            "session.sendPolicy.rules[0].match.chatType",
        ),
        ({"agents": {"defaults": {"sandbox": {"mode": "some"}}}}, "agents.defaults.sandbox.mode"),
        (
            {"agents": {"defaults": {"subagents": {"maxSpawnDepth": 0}}}},
            "agents.defaults.subagents.maxSpawnDepth",
        ),
        (
            {"agents": {"defaults": {"subagents": {"maxChildrenPerAgent": 10_001}}}},
            "agents.defaults.subagents.maxChildrenPerAgent",
        ),
        ({"agents": {"list": [{"id": "a/b"}]}}, "agents.list[0].id"),
        ({"agents": {"list": [{"id": "x" * 65}]}}, "agents.list[0].id"),
        ({"agents": {"list": [{"name": "no id"}]}}, "agents.list[0].id"),
        ({"agents": {"defaults": {"model": 7}}}, "agents.defaults.model"),
        ({"channels": {"x": {"webhook": {"url": "ftp://h/x"}}}}, "channels.x.webhook.url"),
        ({"channels": {"x": {"webhook": {"url": "not a url"}}}}, "channels.x.webhook.url"),
        ({"runs": {"retentionHours": 0}}, "runs.retentionHours"),
        ({"runs": {"timeoutSeconds": 0}}, "runs.timeoutSeconds"),
        ({"delivery": {"backoffBaseS": 5, "backoffMaxS": 1}}, "delivery.backoffMaxS"),
        ({"tools": {"agentToAgent": {"enabled": "yes"}}}, "tools.agentToAgent.enabled"),
        (
            {"session": {"agentToAgent": {"maxPingPongTurns": "3"}}},
            "session.agentToAgent.maxPingPongTurns",
        ),
        ({"channels": ["telegram"]}, "channels"),
    ],
)
def test_invalid_values_raise_config_error(data: dict[str, Any], path: str) -> None:
    """Each bad value raises ConfigError whose message starts with its key path."""
    with pytest.raises(ConfigError, match=r"^invalid config: ") as caught:
        parse_config(data)
    assert str(caught.value).removeprefix("invalid config: ").startswith(path)


def test_duplicate_agent_ids_are_rejected_case_insensitively() -> None:
    """Two entries with the same normalised id are an error at the second one."""
    with pytest.raises(ConfigError) as caught:
        parse_config({"agents": {"list": [{"id": "ops"}, {"id": " OPS "}]}})
    assert caught.value.key_path == "agents.list[1].id"
    assert "duplicate agent id" in str(caught.value)


def test_secrets_are_not_echoed_in_errors() -> None:
    """A bad api key or header value is redacted from the message."""
    data = {
        "models": {"providers": {"p": {"apiKey": ["sk-secret"]}}},
        "channels": {"c": {"webhook": {"url": "http://h.test", "headers": {"X": 12345}}}},
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert "sk-secret" not in str(caught.value)
    assert "12345" not in str(caught.value)
    assert "models.providers.p.apiKey" in str(caught.value)


_RANGES = {
    ("session", "agentToAgent", "maxPingPongTurns"): (0, 5),
    ("agents", "defaults", "subagents", "maxSpawnDepth"): (1, 5),
    ("agents", "defaults", "subagents", "maxChildrenPerAgent"): (1, 10_000),
    ("runs", "maxAttempts"): (1, 20),
}
_ENUMS = {
    ("session", "scope"): {"per-sender", "global"},
    ("session", "sendPolicy", "default"): {"allow", "deny"},
    ("agents", "defaults", "sandbox", "mode"): {"off", "non-main", "all"},
    ("agents", "defaults", "sandbox", "sessionToolsVisibility"): {"spawned", "all"},
}
_NOT_AN_INT = st.one_of(st.text(), st.floats(), st.booleans(), st.none(), st.lists(st.integers()))


@st.composite
def _invalid_setting(draw: st.DrawFn) -> tuple[tuple[str, ...], object]:
    """A numeric or enum key and a value it must refuse."""
    if draw(st.booleans()):
        path = draw(st.sampled_from(sorted(_RANGES)))
        lo, hi = _RANGES[path]
        out_of_range = st.integers(max_value=lo - 1) | st.integers(min_value=hi + 1)
        return path, draw(out_of_range | _NOT_AN_INT)
    path = draw(st.sampled_from(sorted(_ENUMS)))
    allowed = _ENUMS[path]
    wrong = st.text().filter(lambda text: text not in allowed) | st.integers() | st.none()
    return path, draw(wrong)


@given(_invalid_setting())
def test_random_invalid_values_name_their_key(case: tuple[tuple[str, ...], object]) -> None:
    """Any out-of-range or wrongly typed value raises ConfigError naming its key path."""
    path, value = case
    dotted = ".".join(path)
    with pytest.raises(ConfigError) as caught:
        parse_config(_nested(path, value))
    assert caught.value.key_path == dotted
    assert str(caught.value).startswith(f"invalid config: {dotted}")


# --- normalisation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"), [(" Primary ", "primary"), ("   ", "main"), (None, "main")]
)
def test_main_key_is_trimmed_and_lower_cased(raw: str | None, expected: str) -> None:
    """`session.mainKey` is normalised like OpenClaw; blank means `main`."""
    assert _quiet({"session": {"mainKey": raw}}).session.main_key == expected


@pytest.mark.parametrize("raw", ["ALL", " Self ", "agent"])
def test_visibility_is_case_insensitive(raw: str) -> None:
    """`tools.sessions.visibility` accepts any case."""
    visibility = _quiet({"tools": {"sessions": {"visibility": raw}}}).tools.sessions.visibility
    assert visibility == raw.strip().lower()


def test_invalid_visibility_is_an_error_naming_what_is_allowed() -> None:
    """An unknown visibility is refused (OpenClaw falls back to `agent`), naming the choices."""
    with pytest.raises(ConfigError) as err:
        parse_config({"tools": {"sessions": {"visibility": "everyone"}}})
    message = str(err.value)
    assert 'tools.sessions.visibility = "everyone"' in message
    assert all(choice in message for choice in ("'self'", "'tree'", "'agent'", "'all'"))


def test_agent_ids_are_lower_cased() -> None:
    """Agent ids are stored lower-case and looked up case-insensitively."""
    config = _quiet({"agents": {"list": [{"id": " Ops "}]}})
    assert config.agents.list[0].id == "ops"
    assert config.agent("OPS") is config.agents.list[0]
    assert config.agent("other") is None


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("openai/gpt-4o", "openai/gpt-4o"),
        ({"primary": "openai/gpt-4o", "fallbacks": ["x/y"]}, "openai/gpt-4o"),
        ({"fallbacks": ["x/y"]}, None),
        ("  ", None),
    ],
)
def test_model_accepts_both_openclaw_shapes(model: object, expected: str | None) -> None:
    """A model is a `provider/model` string or `{primary, fallbacks}`."""
    config = _quiet(
        {"agents": {"defaults": {"model": model}, "list": [{"id": "a", "model": model}]}}
    )
    assert config.agents.defaults.model_ref == expected
    assert config.agents.list[0].model_ref == expected


# --- helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], "main"),
        ([{"id": "a"}, {"id": "b"}], "a"),
        ([{"id": "a"}, {"id": "b", "default": True}], "b"),
    ],
)
def test_default_agent_id(entries: list[dict[str, Any]], expected: str) -> None:
    """The default agent is the `default: true` entry, else the first, else `main`."""
    assert _quiet({"agents": {"list": entries}}).default_agent_id() == expected


def test_agent_ids_without_list_is_main() -> None:
    """With no agents configured the only agent is `main`."""
    assert _quiet({}).agent_ids() == ["main"]


def test_model_for_falls_back_in_order() -> None:
    """Agent model, then the default model, then the built-in offline model."""
    data: dict[str, Any] = {"agents": {"list": [{"id": "a", "model": "x/a"}, {"id": "b"}]}}
    assert _quiet(data).model_for("a") == "x/a"
    assert _quiet(data).model_for("b") == BUILTIN_MODEL
    data["agents"]["defaults"] = {"model": {"primary": "x/default"}}
    assert _quiet(data).model_for("b") == "x/default"
    assert _quiet(data).model_for("unconfigured") == "x/default"


def test_subagent_model_for_follows_openclaw_order() -> None:
    """Per-agent subagents.model, agent model, defaults subagents.model, default model."""
    data = {
        "agents": {
            "defaults": {"model": "x/default", "subagents": {"model": "x/sub-default"}},
            "list": [
                {"id": "a", "model": "x/a", "subagents": {"model": {"primary": "x/a-sub"}}},
                {"id": "b", "model": "x/b"},
                {"id": "c"},
            ],
        }
    }
    config = _quiet(data)
    picked = [config.subagent_model_for(agent) for agent in ("a", "b", "c")]
    assert picked == ["x/a-sub", "x/b", "x/sub-default"]


@pytest.mark.parametrize(
    ("mode", "is_main", "expected"),
    [
        ("off", True, False),
        ("off", False, False),
        ("non-main", True, False),
        ("non-main", False, True),
        ("all", True, True),
        ("all", False, True),
    ],
)
def test_is_sandboxed(mode: str, is_main: bool, expected: bool) -> None:
    """Sandbox modes: `all` always, `non-main` off the main session, `off` never."""
    config = _quiet({"agents": {"defaults": {"sandbox": {"mode": mode}}}})
    assert config.is_sandboxed("main", is_main_session=is_main) is expected


def test_agent_sandbox_overrides_only_the_keys_it_sets() -> None:
    """An agent's sandbox without `mode` keeps the default mode."""
    data = {
        "agents": {
            "defaults": {"sandbox": {"mode": "all"}},
            "list": [
                {"id": "open", "sandbox": {"mode": "off"}},
                {"id": "partial", "sandbox": {"sessionToolsVisibility": "all"}},
            ],
        }
    }
    config = _quiet(data)
    assert config.is_sandboxed("open", is_main_session=False) is False
    assert config.is_sandboxed("partial", is_main_session=True) is True
    assert config.sandbox_for("partial").session_tools_visibility == "all"


def test_subagents_for_merges_agent_over_defaults() -> None:
    """Per-agent sub-agent settings win where set; defaults fill the rest."""
    data = {
        "agents": {
            "defaults": {
                "subagents": {
                    "allowAgents": ["Work"],
                    "thinking": "low",
                    "requireAgentId": True,
                    "maxSpawnDepth": 3,
                }
            },
            "list": [
                {"id": "a", "subagents": {"allowAgents": ["*"], "requireAgentId": False}},
                {"id": "b"},
            ],
        }
    }
    config = _quiet(data)
    own = config.subagents_for("a")
    assert isinstance(own, EffectiveSubagents)
    assert (own.allow_agents, own.require_agent_id, own.thinking) == (("*",), False, "low")
    assert own.max_spawn_depth == 3
    inherited = config.subagents_for("b")
    assert (inherited.allow_agents, inherited.require_agent_id) == (("work",), True)


# --- settings and cached getters ----------------------------------------------------------


def test_settings_defaults(clean_env: pytest.MonkeyPatch) -> None:
    """Without SWITCHBOARD_* variables the documented defaults apply."""
    settings = Settings()
    assert (settings.host, settings.port, settings.key_prefix) == ("127.0.0.1", 8780, "sb:")
    assert settings.data_dir == Path("./.switchboard")
    assert settings.redis_url is None and settings.config is None
    assert settings.effective_broker_url is None


def test_settings_read_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    """SWITCHBOARD_* variables set the fields; the broker defaults to the Redis URL."""
    clean_env.setenv("SWITCHBOARD_REDIS_URL", "redis://r:6379/0")
    clean_env.setenv("SWITCHBOARD_PORT", "9000")
    clean_env.setenv("SWITCHBOARD_CONFIG", "/etc/sb.json5")
    settings = Settings()
    assert settings.port == 9000
    assert settings.config == Path("/etc/sb.json5")
    assert settings.effective_broker_url == "redis://r:6379/0"
    clean_env.setenv("SWITCHBOARD_BROKER_URL", "redis://b:6379/1")
    assert Settings().effective_broker_url == "redis://b:6379/1"


def test_bad_setting_names_the_variable(clean_env: pytest.MonkeyPatch) -> None:
    """An unusable environment value raises ConfigError naming the variable."""
    clean_env.setenv("SWITCHBOARD_PORT", "eighty")
    with pytest.raises(ConfigError, match=r"^invalid setting: SWITCHBOARD_PORT = \"eighty\""):
        get_settings()


def test_get_settings_is_cached_until_reset(clean_env: pytest.MonkeyPatch) -> None:
    """The settings are read once; reset_caches makes the next call re-read."""
    first = get_settings()
    clean_env.setenv("SWITCHBOARD_PORT", "9001")
    assert get_settings() is first
    reset_caches()
    assert get_settings().port == 9001


def test_get_config_uses_switchboard_config(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without a path, get_config loads SWITCHBOARD_CONFIG once and caches it."""
    path = tmp_path / "sb.json5"
    path.write_text("{session: {scope: 'global'}}", encoding="utf-8")
    clean_env.setenv("SWITCHBOARD_CONFIG", str(path))
    config = get_config()
    assert config.session.scope == "global"
    path.write_text("{}", encoding="utf-8")
    assert get_config() is config
    reset_caches()
    assert get_config().session.scope == "per-sender"


def test_get_config_caches_per_path(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An explicit path wins over the environment and gets its own cache entry."""
    one, two = tmp_path / "one.json5", tmp_path / "two.json5"
    one.write_text("{runs: {maxAttempts: 1}}", encoding="utf-8")
    two.write_text("{runs: {maxAttempts: 2}}", encoding="utf-8")
    clean_env.setenv("SWITCHBOARD_CONFIG", str(one))
    assert get_config(two).runs.max_attempts == 2
    assert get_config(str(two)) is get_config(two)
    assert get_config().runs.max_attempts == 1


def test_get_config_without_any_path_is_defaults(clean_env: pytest.MonkeyPatch) -> None:
    """No path and no SWITCHBOARD_CONFIG means all defaults."""
    assert get_config() == SwitchboardConfig()
