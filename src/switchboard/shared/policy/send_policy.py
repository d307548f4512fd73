"""Send policy: whether a session may have runs started and replies delivered, and ``/send``.

Pure decisions over the config and the session entry the caller looked up. Resolution
follows OpenClaw's ``resolveSendPolicy`` (reference §6.2): the entry's override wins, then
the rules in order (first matching deny wins), then the default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from switchboard.shared.config import SendPolicyMatch, SwitchboardConfig
from switchboard.shared.keys import chat_type as key_chat_type
from switchboard.shared.keys import key_channel, strip_agent_prefix

SendDecision = Literal["allow", "deny"]

SEND_BLOCKED = "send blocked by session policy"
SEND_USAGE = "⚙️ Usage: /send on|off|inherit"

_CHAT_TYPES = frozenset({"direct", "group", "channel"})
# `/send` in any case, optionally one ASCII word, nothing else (OpenClaw's parser, reference
# §6.3). Cases spelled out: re.IGNORECASE would also accept Unicode look-alikes of the
# letters (long s U+017F, Kelvin sign U+212A).
_SEND_COMMAND = re.compile(r"/[sS][eE][nN][dD](?:\s+([a-zA-Z]+))?\s*")
_SEND_WORDS: dict[str, tuple[SendDecision | None, str]] = {
    "on": ("allow", "on"),
    "allow": ("allow", "on"),
    "off": ("deny", "off"),
    "deny": ("deny", "off"),
    "inherit": (None, "inherit"),
    "default": (None, "inherit"),
    "reset": (None, "inherit"),
}


@dataclass(frozen=True)
class _MatchInputs:
    """What the rules of one resolution are matched against, all lower-case."""

    channel: str | None
    chat_type: str | None
    raw_key: str
    stripped_key: str


def normalize_send_policy(value: object) -> SendDecision | None:
    """Read an ``allow``/``deny`` override (any case, trimmed); anything else is None."""
    if not isinstance(value, str):
        return None
    cleaned = value.strip().lower()
    return "allow" if cleaned == "allow" else "deny" if cleaned == "deny" else None


def resolve_send_policy(
    config: SwitchboardConfig,
    *,
    session_key: str,
    entry: Mapping[str, Any] | None,
    channel: str | None = None,
    chat_type: str | None = None,
) -> SendDecision:
    """Decide whether sends to the session ``session_key`` are allowed.

    ``entry`` is the stored session entry (camelCase fields ``sendPolicy``, ``channel``,
    ``lastChannel``, ``chatType``), or None for a session not created yet.
    """
    entry = entry or {}
    override = normalize_send_policy(entry.get("sendPolicy"))
    if override is not None:
        return override
    policy = config.session.send_policy
    if policy is None:
        return "allow"
    inputs = _match_inputs(session_key, entry, channel, chat_type, config.session.main_key)
    allow_matched = False
    for rule in policy.rules:
        if not _rule_matches(rule.match, inputs):
            continue
        if rule.action == "deny":
            return "deny"
        allow_matched = True
    return "allow" if allow_matched else policy.default


def session_send_decision(
    config: SwitchboardConfig,
    session_key: str,
    entry: Mapping[str, Any] | None,
    *,
    channel: str | None = None,
) -> SendDecision:
    """Decide a send to a session as stored (``entry``; None: not created yet).

    Rules match the session's own channel; the request's ``channel`` counts only for a
    session that does not exist yet (it becomes that session's channel)."""
    return resolve_send_policy(
        config,
        session_key=session_key,
        entry=entry,
        channel=None if entry is not None else channel,
    )


def _match_inputs(
    session_key: str,
    entry: Mapping[str, Any],
    channel: str | None,
    chat_type: str | None,
    main_key: str,
) -> _MatchInputs:
    """Collect the channel, chat type and both key forms the rules are matched against."""
    # `keys.key_channel` also reads `<ch>:direct:<peer>` DM keys, where OpenClaw only reads
    # group/channel keys; it is the last resort, after the entry's recorded channels.
    found_channel = (
        _clean(channel)
        or _clean(entry.get("channel"))
        or _clean(entry.get("lastChannel"))
        or key_channel(session_key)
    )
    given_type = chat_type if chat_type is not None else entry.get("chatType")
    # The key-derived type comes from the project's one classifier (`keys.chat_type`), the
    # same one that records `chatType` on new entries; unlike OpenClaw's copy it reads the
    # main session as `direct`, so an entry without `chatType` behaves like one that has it.
    derived_type = key_chat_type(session_key, main_key=main_key)
    found_type = _normalize_chat_type(given_type) or _normalize_chat_type(derived_type)
    return _MatchInputs(
        channel=found_channel,
        chat_type=found_type,
        raw_key=session_key.lower(),
        stripped_key=strip_agent_prefix(session_key).lower(),
    )


def _rule_matches(match: SendPolicyMatch | None, inputs: _MatchInputs) -> bool:
    """Tell whether every criterion a rule sets holds (a rule without criteria matches)."""
    if match is None:
        return True
    want_channel = _clean(match.channel)
    if want_channel and want_channel != inputs.channel:
        return False
    want_type = _normalize_chat_type(match.chat_type)
    if want_type and want_type != inputs.chat_type:
        return False
    raw_prefix = _clean(match.raw_key_prefix)
    if raw_prefix and not inputs.raw_key.startswith(raw_prefix):
        return False
    prefix = _clean(match.key_prefix)
    return not prefix or inputs.raw_key.startswith(prefix) or inputs.stripped_key.startswith(prefix)


def _clean(value: object) -> str | None:
    """Trim and lower-case a string; empty or not a string gives None."""
    if not isinstance(value, str):
        return None
    return value.strip().lower() or None


def _normalize_chat_type(value: object) -> str | None:
    """``direct``/``group``/``channel`` (``dm`` means ``direct``); anything else is None."""
    cleaned = _clean(value)
    if cleaned == "dm":
        return "direct"
    return cleaned if cleaned in _CHAT_TYPES else None


@dataclass(frozen=True)
class SendCommand:
    """A parsed ``/send`` message: the override to store (None clears it) and the reply.

    ``valid`` is False for a bare ``/send`` or an unknown word; then nothing changes and
    ``reply`` is the usage line.
    """

    valid: bool
    value: SendDecision | None
    reply: str


def parse_send_command(text: str) -> SendCommand | None:
    """Parse the owner's standalone ``/send on|off|inherit``; None if it is not one at all."""
    found = _SEND_COMMAND.fullmatch(text.strip())
    if found is None:
        return None
    word = (found.group(1) or "").lower()
    if word not in _SEND_WORDS:
        return SendCommand(valid=False, value=None, reply=SEND_USAGE)
    value, label = _SEND_WORDS[word]
    return SendCommand(valid=True, value=value, reply=f"⚙️ Send policy set to {label}.")
