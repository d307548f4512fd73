"""Send policy resolution and the owner's `/send` command (switchboard.shared.policy)."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.shared.config import SwitchboardConfig
from switchboard.shared.policy.send_policy import (
    SEND_BLOCKED,
    SendCommand,
    SendDecision,
    parse_send_command,
    resolve_send_policy,
    session_send_decision,
)

pytestmark = pytest.mark.unit

MAIN = "agent:main:main"
DISCORD_GROUP = "agent:main:discord:group:dev"
DISCORD_CHANNEL = "agent:main:discord:channel:news"
TELEGRAM_DM = "agent:main:telegram:dm:42"
CRON = "agent:main:cron:nightly"


def make_config(
    rules: list[dict[str, Any]] | None = None,
    default: str | None = None,
    *,
    main_key: str | None = None,
) -> SwitchboardConfig:
    """A config whose `session.sendPolicy` has these rules and default."""
    session: dict[str, Any] = {"sendPolicy": {"rules": rules or []}}
    if default is not None:
        session["sendPolicy"]["default"] = default
    if main_key is not None:
        session["mainKey"] = main_key
    return SwitchboardConfig.model_validate({"session": session})


def deny(**match: str) -> dict[str, Any]:
    """A deny rule with these (camelCase) match criteria."""
    return {"action": "deny", "match": match}


def allow(**match: str) -> dict[str, Any]:
    """An allow rule with these (camelCase) match criteria."""
    return {"action": "allow", "match": match}


def resolve(
    config: SwitchboardConfig,
    key: str,
    entry: dict[str, Any] | None = None,
    *,
    channel: str | None = None,
    chat_type: str | None = None,
) -> str:
    """resolve_send_policy for one key, entry and optional channel/chat_type hints."""
    return resolve_send_policy(
        config, session_key=key, entry=entry, channel=channel, chat_type=chat_type
    )


# --- basics ---------------------------------------------------------------------------------


def test_blocked_message_is_openclaws() -> None:
    """The refusal text matches OpenClaw's gateway error."""
    assert SEND_BLOCKED == "send blocked by session policy"


def test_no_send_policy_allows_everything() -> None:
    """Without `session.sendPolicy` every session is allowed."""
    assert resolve(SwitchboardConfig(), DISCORD_GROUP) == "allow"


def test_empty_policy_uses_default_allow() -> None:
    """A policy without rules or default allows."""
    assert resolve(make_config(), DISCORD_GROUP) == "allow"


def test_default_deny_without_matching_rule() -> None:
    """When no rule matches, `default: deny` decides."""
    config = make_config([allow(channel="telegram")], default="deny")
    assert resolve(config, DISCORD_GROUP) == "deny"


# --- rule precedence ------------------------------------------------------------------------


def test_first_matching_deny_wins_even_after_an_allow() -> None:
    """A matching deny after a matching allow still denies."""
    config = make_config([allow(channel="discord"), deny(chatType="group")])
    assert resolve(config, DISCORD_GROUP) == "deny"


def test_matching_allow_beats_default_deny() -> None:
    """A matching allow sets the flag that overrides `default: deny`."""
    config = make_config([allow(channel="discord"), deny(channel="telegram")], default="deny")
    assert resolve(config, DISCORD_GROUP) == "allow"


def test_non_matching_deny_is_skipped() -> None:
    """A deny whose criteria do not all hold has no effect."""
    config = make_config([deny(channel="discord", chatType="direct")])
    assert resolve(config, DISCORD_GROUP) == "allow"


def test_rule_without_match_applies_to_everything() -> None:
    """A rule with no `match` matches every session."""
    config = SwitchboardConfig.model_validate(
        {"session": {"sendPolicy": {"rules": [{"action": "deny"}]}}}
    )
    assert resolve(config, MAIN) == "deny"


def test_rule_action_defaults_to_allow() -> None:
    """A rule without `action` counts as an allow."""
    config = make_config([{"match": {"channel": "discord"}}], default="deny")
    assert resolve(config, DISCORD_GROUP) == "allow"


# --- entry override -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"), [("deny", "deny"), (" DENY ", "deny"), ("Allow", "allow")]
)
def test_entry_override_beats_rules(override: str, expected: str) -> None:
    """The session's own `sendPolicy` (any case) wins over rules and default."""
    rules = [deny(channel="discord")] if expected == "allow" else [allow(channel="discord")]
    config = make_config(rules, default="allow" if expected == "deny" else "deny")
    assert resolve(config, DISCORD_GROUP, {"sendPolicy": override}) == expected


def test_entry_override_applies_without_config_policy() -> None:
    """A per-session deny holds even when no `session.sendPolicy` is configured."""
    assert resolve(SwitchboardConfig(), MAIN, {"sendPolicy": "deny"}) == "deny"


@pytest.mark.parametrize("override", [None, "", "maybe", 1])
def test_invalid_override_inherits(override: object) -> None:
    """An unset or unrecognised override falls through to the rules."""
    config = make_config([deny(channel="discord")])
    assert resolve(config, DISCORD_GROUP, {"sendPolicy": override}) == "deny"


# --- key prefixes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "key", "expected"),
    [
        ("agent:main:cron:", CRON, "deny"),
        ("cron:", CRON, "deny"),
        ("CRON:", CRON, "deny"),
        ("cron:", "agent:main:hook:x", "allow"),
        ("agent:ops:", CRON, "allow"),
    ],
)
def test_key_prefix_matches_raw_or_stripped_key(prefix: str, key: str, expected: str) -> None:
    """`keyPrefix` matches the raw key or the key without `agent:<id>:`, case-insensitively."""
    assert resolve(make_config([deny(keyPrefix=prefix)]), key) == expected


@pytest.mark.parametrize(
    ("prefix", "expected"), [("cron:", "allow"), ("agent:main:cron:", "deny"), ("AGENT:", "deny")]
)
def test_raw_key_prefix_matches_only_the_raw_key(prefix: str, expected: str) -> None:
    """`rawKeyPrefix` ignores the stripped key form."""
    assert resolve(make_config([deny(rawKeyPrefix=prefix)]), CRON) == expected


# --- chat type ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [(DISCORD_GROUP, "deny"), (DISCORD_CHANNEL, "allow"), (TELEGRAM_DM, "allow")],
)
def test_chat_type_derived_from_key(key: str, expected: str) -> None:
    """Without hints the chat type comes from the key's `group`/`channel`/`dm` token."""
    assert resolve(make_config([deny(chatType="group")]), key) == expected


def test_dm_rule_matches_direct_sessions() -> None:
    """A rule's `chatType: dm` means `direct`, and so does a key's `dm` token."""
    config = make_config([deny(chatType="dm")])
    assert resolve(config, TELEGRAM_DM) == "deny"
    assert resolve(config, DISCORD_GROUP) == "allow"


def test_main_session_counts_as_direct() -> None:
    """The main bucket (per `session.mainKey`) is a direct chat when the entry has no type."""
    config = make_config([deny(chatType="direct")], main_key="work")
    assert resolve(config, "agent:main:work") == "deny"
    assert resolve(config, "agent:main:other") == "allow"


def test_explicit_chat_type_beats_entry_and_key() -> None:
    """An explicit chat type wins over the entry's and the key's."""
    config = make_config([deny(chatType="channel")])
    entry = {"chatType": "group"}
    assert resolve(config, DISCORD_GROUP, entry, chat_type="channel") == "deny"


def test_entry_chat_type_beats_key() -> None:
    """The entry's recorded `chatType` wins over the one derived from the key."""
    config = make_config([deny(chatType="direct")])
    assert resolve(config, DISCORD_GROUP, {"chatType": "DM"}) == "deny"
    assert resolve(config, DISCORD_GROUP) == "allow"


# --- channel --------------------------------------------------------------------------------


def test_channel_from_last_channel() -> None:
    """A direct session's channel comes from the entry's `lastChannel`."""
    config = make_config([deny(channel="whatsapp")])
    assert resolve(config, MAIN, {"lastChannel": "WhatsApp"}) == "deny"
    assert resolve(config, MAIN, {"lastChannel": "telegram"}) == "allow"
    assert resolve(config, MAIN) == "allow"


def test_channel_precedence_explicit_entry_last_key() -> None:
    """Explicit channel, then entry `channel`, then `lastChannel`, then the key's channel."""
    config = make_config([deny(channel="slack")])
    entry = {"channel": "slack", "lastChannel": "discord"}
    assert resolve(config, DISCORD_GROUP, entry) == "deny"
    assert resolve(config, DISCORD_GROUP, entry, channel="discord") == "allow"
    assert resolve(config, DISCORD_GROUP, {"channel": " ", "lastChannel": "SLACK"}) == "deny"


def test_channel_derived_from_group_key() -> None:
    """A group key's channel segment is used when nothing else names the channel."""
    config = make_config([deny(channel="Discord")])
    assert resolve(config, DISCORD_GROUP) == "deny"
    assert resolve(config, "agent:main:telegram:group:1") == "allow"


# --- /send ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "reply"),
    [
        ("/send on", "allow", "⚙️ Send policy set to on."),
        ("/send allow", "allow", "⚙️ Send policy set to on."),
        ("/send off", "deny", "⚙️ Send policy set to off."),
        ("/send deny", "deny", "⚙️ Send policy set to off."),
        ("/send inherit", None, "⚙️ Send policy set to inherit."),
        ("/send default", None, "⚙️ Send policy set to inherit."),
        ("/send reset", None, "⚙️ Send policy set to inherit."),
        ("  /SEND   Off  ", "deny", "⚙️ Send policy set to off."),
        ("/Send\tON\n", "allow", "⚙️ Send policy set to on."),
    ],
)
def test_send_command_sets_override(text: str, value: SendDecision | None, reply: str) -> None:
    """`/send on|off|inherit` and their aliases parse case-insensitively to an override."""
    assert parse_send_command(text) == SendCommand(valid=True, value=value, reply=reply)


@pytest.mark.parametrize("text", ["/send", "/SEND  ", "/send maybe", "/send enable"])
def test_send_command_usage(text: str) -> None:
    """A bare `/send` or an unknown word answers with the usage line and changes nothing."""
    expected = SendCommand(valid=False, value=None, reply="⚙️ Usage: /send on|off|inherit")
    assert parse_send_command(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello",
        "/sendon",
        "/send on now",
        "/send 1",
        "please /send on",
        "/status",
        "/\u017fend on",
    ],
)
def test_not_a_send_command(text: str) -> None:
    """Anything but a standalone `/send [word]` is not a /send command at all."""
    assert parse_send_command(text) is None


# --- a send to a session as stored (session_send_decision) ----------------------------------


def test_a_requests_channel_counts_only_for_a_session_not_created_yet() -> None:
    """No entry: the request's channel is the session's; an entry: the request's is ignored."""
    config = make_config([deny(channel="telegram")])
    assert session_send_decision(config, MAIN, None, channel="telegram") == "deny"
    assert session_send_decision(config, MAIN, {}, channel="telegram") == "allow"
    stored = {"channel": "telegram"}
    assert session_send_decision(config, MAIN, stored, channel="discord") == "deny"
