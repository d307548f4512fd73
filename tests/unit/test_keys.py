"""Unit tests for the session key model in switchboard.shared.keys."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchboard.shared import keys
from switchboard.shared.errors import InvalidInput
from switchboard.shared.keys import (
    ParsedKey,
    agent_id_of,
    canonical_key,
    chat_type,
    derive_channel,
    display_key,
    format_key,
    is_subagent_key,
    is_valid_agent_id,
    key_channel,
    looks_like_session_id,
    main_session_key,
    new_session_id,
    normalize_agent_id,
    normalize_main_key,
    parse_agent_key,
    session_kind,
    strip_agent_prefix,
    subagent_key,
)

pytestmark = pytest.mark.unit

# Strategies -----------------------------------------------------------------------------

agent_ids = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,63}", fullmatch=True)
segments = st.from_regex(r"[a-z0-9_\-.@#+=/]{1,12}", fullmatch=True)
rests = st.lists(segments, min_size=1, max_size=5).map(":".join)
main_keys = st.sampled_from(["main", "primary", "work"])
scopes = st.sampled_from(["per-sender", "global"])
safe_alphabet = "abcXYZ019:_-.@#+=/ "
raw_keys = st.one_of(
    st.text(alphabet=safe_alphabet, max_size=40),
    st.builds(lambda a, r: f"AGENT:{a.upper()}:{r}", agent_ids, rests),
    st.builds(format_key, agent_ids, rests),
    rests,
    st.sampled_from(["main", "MAIN", "primary", "global", "unknown", "agent:x:main"]),
    st.text(max_size=30),
)


# Constants and formatting ---------------------------------------------------------------


def test_constants_match_the_spec() -> None:
    """The public constants hold the values the spec names."""
    assert keys.MAX_KEY_LENGTH == 512
    assert keys.DEFAULT_AGENT_ID == "main"
    assert frozenset({"global", "unknown"}) == keys.RESERVED_KEYS
    assert keys.KINDS == ("main", "group", "cron", "hook", "node", "other")
    assert keys.AGENT_ID_PATTERN.pattern == r"^[a-z0-9][a-z0-9_-]{0,63}$"


def test_format_key_joins_agent_and_rest() -> None:
    """format_key builds agent:<id>:<rest>."""
    assert format_key("ops", "cron:nightly") == "agent:ops:cron:nightly"


# Agent ids ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["main", "ops", "a", "Ops", " ops ", "a_b-c", "9" * 64])
def test_is_valid_agent_id_accepts_valid_ids(value: str) -> None:
    """is_valid_agent_id accepts trimmed ids of any case matching the pattern."""
    assert is_valid_agent_id(value)


@pytest.mark.parametrize("value", ["", "-ops", "_ops", "bad id", "a" * 65, "ops!", "ma\nin", "é"])
def test_is_valid_agent_id_rejects_invalid_ids(value: str) -> None:
    """is_valid_agent_id rejects ids that break the pattern."""
    assert not is_valid_agent_id(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "main"),
        ("", "main"),
        ("   ", "main"),
        ("  Ops ", "ops"),
        ("Bad Id!", "bad-id"),
        ("--x--", "x"),
        ("_x", "x"),
        ("!!!", "main"),
        ("a" * 100, "a" * 64),
    ],
)
def test_normalize_agent_id_is_lenient(value: str | None, expected: str) -> None:
    """normalize_agent_id lower-cases, slugs invalid runs, trims and defaults to main."""
    assert normalize_agent_id(value) == expected


@given(st.text(max_size=100))
def test_normalize_agent_id_always_yields_a_valid_id(value: str) -> None:
    """Whatever the input, normalize_agent_id returns a strictly valid id."""
    assert keys.AGENT_ID_PATTERN.fullmatch(normalize_agent_id(value))


@pytest.mark.parametrize(
    ("value", "expected"), [(None, "main"), ("", "main"), (" Primary ", "primary")]
)
def test_normalize_main_key_trims_lowercases_and_defaults(value: str | None, expected: str) -> None:
    """normalize_main_key trims, lower-cases and falls back to main."""
    assert normalize_main_key(value) == expected


# Parsing --------------------------------------------------------------------------------


def test_parse_agent_key_lowercases_both_parts() -> None:
    """parse_agent_key lower-cases the id and the rest."""
    assert parse_agent_key("AGENT:Main:Hook:Webhook:42") == ParsedKey("main", "hook:webhook:42")


@pytest.mark.parametrize(
    "key",
    [
        "agent:main",
        "agent::x",
        "agent:main:",
        "main",
        "cron:x",
        "agent:bad id:x",
        "agent:main\n:x",
        "agentx:a:b",
    ],
)
def test_parse_agent_key_returns_none_for_non_agent_keys(key: str) -> None:
    """parse_agent_key gives None when the id is invalid or the rest is missing."""
    assert parse_agent_key(key) is None


@given(agent_ids, rests)
def test_parse_inverts_format(agent_id: str, rest: str) -> None:
    """Parsing a formatted key gives back its agent id and rest."""
    assert parse_agent_key(format_key(agent_id, rest)) == ParsedKey(agent_id, rest)


@given(raw_keys)
def test_format_inverts_parse(key: str) -> None:
    """Formatting a parsed key gives back the trimmed, lower-cased key."""
    parsed = parse_agent_key(key)
    if parsed is not None:
        assert format_key(parsed.agent_id, parsed.rest) == key.strip().lower()


# Main session ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent_id", "main_key", "scope", "expected"),
    [
        ("main", "main", "per-sender", "agent:main:main"),
        ("Ops", " Primary ", "per-sender", "agent:ops:primary"),
        ("ops", "main", "global", "global"),
    ],
)
def test_main_session_key(agent_id: str, main_key: str, scope: str, expected: str) -> None:
    """main_session_key is agent:<id>:<mainKey>, or global under scope global."""
    assert main_session_key(agent_id, main_key, scope) == expected


# Canonical keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "agent_id", "main_key", "scope", "expected"),
    [
        ("main", "ops", "main", "per-sender", "agent:ops:main"),
        (" MAIN ", "ops", "main", "per-sender", "agent:ops:main"),
        ("main", "ops", "primary", "per-sender", "agent:ops:primary"),
        ("primary", "ops", "primary", "per-sender", "agent:ops:primary"),
        ("main", "ops", "main", "global", "global"),
        ("global", "ops", "main", "global", "global"),
        ("agent:main:main", "ops", "main", "per-sender", "agent:main:main"),
        ("agent:dev:main", "ops", "primary", "per-sender", "agent:dev:primary"),
        ("agent:dev:primary", "ops", "primary", "global", "global"),
        ("agent:main:main", "ops", "main", "global", "global"),
        ("AGENT:Dev:Discord:Group:Dev", "ops", "main", "per-sender", "agent:dev:discord:group:dev"),
        ("cron:X", "ops", "main", "per-sender", "agent:ops:cron:x"),
        ("hook:abc", "ops", "main", "per-sender", "agent:ops:hook:abc"),
        ("node-1", "ops", "main", "per-sender", "agent:ops:node-1"),
        ("discord:group:dev", "ops", "main", "per-sender", "agent:ops:discord:group:dev"),
        ("subagent:1234", "Ops", "main", "per-sender", "agent:ops:subagent:1234"),
        (
            "whatsapp:group:120363@g.us",
            "ops",
            "main",
            "per-sender",
            "agent:ops:whatsapp:group:120363@g.us",
        ),
        ("slack:channel:#general", "ops", "main", "per-sender", "agent:ops:slack:channel:#general"),
        ("agent:main:main:extra", "ops", "main", "per-sender", "agent:main:main:extra"),
    ],
)
def test_canonical_key_accepts_and_canonicalises(
    raw: str, agent_id: str, main_key: str, scope: str, expected: str
) -> None:
    """canonical_key maps main aliases, lower-cases agent keys and prefixes bare keys."""
    assert canonical_key(raw, agent_id=agent_id, main_key=main_key, scope=scope) == expected


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("agent::x", "empty segment"),
        ("agent:main:", "empty segment"),
        ("cron::x", "empty segment"),
        (":x", "empty segment"),
        ("agent:main", "malformed"),
        ("agent:-bad:x", "malformed"),
        ("agent:" + "a" * 65 + ":x", "malformed"),
        ("agent:Bad Id:x", "whitespace"),
        ("cron:a\tb", "whitespace"),
        ("cron:a\x00b", "control"),
        ("cron:a*b", "illegal characters '*'"),
        ("cron:{tag}", "illegal characters"),
        ("cron:é", "illegal characters"),
        ("current", "current"),
        ("CURRENT", "current"),
        ("global", "reserved"),
        ("unknown", "reserved"),
        ("x" * 513, "too long"),
    ],
)
def test_canonical_key_rejects_malformed_input(raw: str, fragment: str) -> None:
    """canonical_key raises InvalidInput on sessionKey with a message naming the problem."""
    with pytest.raises(InvalidInput) as caught:
        canonical_key(raw, agent_id="main")
    assert fragment in caught.value.message
    assert caught.value.fields == {"field": "sessionKey"}


def test_canonical_key_rejects_unknown_even_under_global_scope() -> None:
    """Only global becomes the main session under scope global; unknown stays reserved."""
    with pytest.raises(InvalidInput, match="reserved"):
        canonical_key("unknown", agent_id="main", scope="global")


def test_canonical_key_length_limit_is_inclusive() -> None:
    """A 512-character agent key is accepted; 513 is not."""
    key = format_key("main", "x" * (512 - len("agent:main:")))
    assert canonical_key(key, agent_id="main") == key
    with pytest.raises(InvalidInput, match="too long"):
        canonical_key(key + "x", agent_id="main")


def test_canonical_key_rejects_bare_key_that_grows_past_the_limit() -> None:
    """A bare key that fits but whose canonical form exceeds 512 characters is rejected."""
    with pytest.raises(InvalidInput, match="too long"):
        canonical_key("x" * 510, agent_id="main")


@given(raw_keys, agent_ids, main_keys, scopes)
def test_canonical_key_is_idempotent(raw: str, agent_id: str, main_key: str, scope: str) -> None:
    """canonical_key(canonical_key(x)) == canonical_key(x) for every accepted x."""
    try:
        once = canonical_key(raw, agent_id=agent_id, main_key=main_key, scope=scope)
    except InvalidInput:
        return
    assert canonical_key(once, agent_id=agent_id, main_key=main_key, scope=scope) == once


@given(raw_keys, agent_ids, main_keys, scopes)
def test_canonical_key_output_is_a_lowercase_agent_key_or_global(
    raw: str, agent_id: str, main_key: str, scope: str
) -> None:
    """Every canonical key is lower-case, within the limit, and agent:-prefixed or global."""
    try:
        key = canonical_key(raw, agent_id=agent_id, main_key=main_key, scope=scope)
    except InvalidInput:
        return
    assert key == key.lower()
    assert len(key) <= keys.MAX_KEY_LENGTH
    assert parse_agent_key(key) is not None or (key == "global" and scope == "global")


# Display, prefix helpers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "main_key", "expected"),
    [
        ("agent:ops:main", "main", "main"),
        ("agent:ops:primary", "primary", "main"),
        ("global", "main", "main"),
        ("main", "main", "main"),
        ("primary", "primary", "main"),
        ("agent:main:main", "main", "agent:main:main"),
        ("agent:ops:cron:x", "main", "agent:ops:cron:x"),
    ],
)
def test_display_key_shows_own_main_as_main(key: str, main_key: str, expected: str) -> None:
    """display_key collapses the caller's own main session and global to main only."""
    assert display_key(key, agent_id="ops", main_key=main_key) == expected


@given(agent_ids, main_keys, scopes)
def test_display_key_hides_every_canonical_main(agent_id: str, main_key: str, scope: str) -> None:
    """The canonical form of "main" is always displayed as "main" to its own agent."""
    key = canonical_key("main", agent_id=agent_id, main_key=main_key, scope=scope)
    assert display_key(key, agent_id=agent_id, main_key=main_key, scope=scope) == "main"


@pytest.mark.parametrize(
    ("key", "agent_id", "rest"),
    [
        ("agent:ops:cron:x", "ops", "cron:x"),
        ("AGENT:Ops:Cron:X", "ops", "cron:x"),
        ("cron:x", "main", "cron:x"),
        ("agent:main", "main", "agent:main"),
    ],
)
def test_agent_id_of_and_strip_agent_prefix(key: str, agent_id: str, rest: str) -> None:
    """agent_id_of falls back to main and strip_agent_prefix leaves unparsable keys alone."""
    assert agent_id_of(key) == agent_id
    assert strip_agent_prefix(key) == rest


# Kinds, chat types, channels ------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "main_key", "expected"),
    [
        ("agent:main:main", "main", "main"),
        ("agent:ops:primary", "primary", "main"),
        ("agent:ops:main", "primary", "other"),
        ("global", "main", "main"),
        ("main", "main", "main"),
        ("agent:main:cron:nightly", "main", "cron"),
        ("agent:main:cron:nightly:run:abc", "main", "cron"),
        ("cron:job-1", "main", "cron"),
        ("agent:main:hook:abc", "main", "hook"),
        ("agent:main:node-7", "main", "node"),
        ("agent:main:node:7", "main", "node"),
        ("agent:main:discord:group:dev", "main", "group"),
        ("agent:main:slack:channel:general", "main", "group"),
        ("discord:group:dev", "main", "group"),
        ("agent:main:subagent:1234", "main", "other"),
        ("agent:main:telegram:direct:42", "main", "other"),
        ("agent:main:groups:x", "main", "other"),
    ],
)
def test_session_kind_classifies_after_stripping_prefix(
    key: str, main_key: str, expected: str
) -> None:
    """session_kind judges the rest after agent:<id>: (SPEC §1 Fix), so real keys classify."""
    assert session_kind(key, main_key=main_key) == expected


def test_session_kind_global_is_main_under_global_scope() -> None:
    """Under scope global, the internal global key is the main session."""
    assert session_kind("global", scope="global") == "main"


@given(agent_ids, rests)
def test_session_kind_is_one_of_the_six(agent_id: str, rest: str) -> None:
    """session_kind always returns one of KINDS."""
    assert session_kind(format_key(agent_id, rest)) in keys.KINDS


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("agent:main:main", "direct"),
        ("global", "direct"),
        ("agent:main:discord:group:dev", "group"),
        ("agent:main:slack:channel:general", "channel"),
        ("agent:main:telegram:direct:42", "direct"),
        ("agent:main:direct:42", "direct"),
        ("agent:main:signal:dm:42", "direct"),
        ("agent:main:group:abc", "group"),
        ("agent:main:120363-1@g.us", "group"),
        ("agent:main:whatsapp:120363@g.us", "group"),
        ("agent:main:discord:acct:guild-1:channel-2", "channel"),
        ("agent:main:discord:guild-1:channel-2", "channel"),
        ("agent:main:cron:x", "unknown"),
        ("agent:main:subagent:1234", "unknown"),
    ],
)
def test_chat_type_from_key_tokens(key: str, expected: str) -> None:
    """chat_type reads group/channel/direct tokens and legacy WhatsApp/Discord shapes."""
    assert chat_type(key) == expected


def test_chat_type_main_session_honours_custom_main_key() -> None:
    """The main session is a direct chat whatever session.mainKey is."""
    assert chat_type("agent:ops:primary", main_key="primary") == "direct"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("agent:main:discord:group:dev", "discord"),
        ("agent:main:slack:channel:general", "slack"),
        ("agent:main:telegram:direct:42", "telegram"),
        ("agent:main:telegram:acct1:direct:42", "telegram"),
        ("discord:group:dev", "discord"),
        ("agent:main:direct:42", None),
        ("agent:main:main", None),
        ("agent:main:cron:x", None),
        ("agent:main:discord:group", None),
    ],
)
def test_key_channel_reads_channel_of_peer_keys(key: str, expected: str | None) -> None:
    """key_channel returns the first segment of <channel>:<group|channel|direct>:… rests."""
    assert key_channel(key) == expected


@pytest.mark.parametrize(
    ("key", "kind", "entry", "last", "expected"),
    [
        ("agent:main:cron:x", "cron", "telegram", "telegram", "internal"),
        ("agent:main:hook:x", "hook", None, None, "internal"),
        ("agent:main:node-1", "node", None, None, "internal"),
        ("agent:main:discord:group:dev", "group", "Telegram ", None, "telegram"),
        ("agent:main:discord:group:dev", "group", None, "slack", "discord"),
        ("agent:main:discord:group:dev", "group", "  ", None, "discord"),
        ("agent:main:main", "main", None, "whatsapp", "whatsapp"),
        ("agent:main:main", "main", "discord", None, "unknown"),
        ("agent:main:telegram:direct:42", "other", None, None, "telegram"),
        ("agent:main:subagent:1", "other", None, None, "unknown"),
    ],
)
def test_derive_channel(
    key: str, kind: str, entry: str | None, last: str | None, expected: str
) -> None:
    """derive_channel: internal kinds, group entry/key channel, DM lastChannel, else unknown."""
    assert derive_channel(key, kind=kind, entry_channel=entry, last_channel=last) == expected


# Session ids and sub-agents -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("123e4567-e89b-42d3-a456-426614174000", True),
        (" 123E4567-E89B-42D3-A456-426614174000 ", True),
        ("123e4567e89b42d3a456426614174000", False),
        ("123e4567-e89b-42d3-a456-42661417400g", False),
        ("123e4567-e89b-42d3-a456-426614174000\n-x", False),
        ("main", False),
        ("", False),
    ],
)
def test_looks_like_session_id(value: str, expected: bool) -> None:
    """looks_like_session_id accepts trimmed UUIDs of any case and nothing else."""
    assert looks_like_session_id(value) is expected


@given(st.uuids())
def test_looks_like_session_id_accepts_every_uuid(value: uuid.UUID) -> None:
    """Any UUID string, upper- or lower-case, is recognised as a session id."""
    assert looks_like_session_id(str(value))
    assert looks_like_session_id(str(value).upper())


def test_new_session_id_is_a_fresh_uuid4() -> None:
    """new_session_id returns distinct version-4 UUID strings."""
    first, second = new_session_id(), new_session_id()
    assert first != second
    assert uuid.UUID(first).version == 4
    assert looks_like_session_id(first)


def test_subagent_key_shape() -> None:
    """subagent_key is agent:<id>:subagent:<uuid4> and canonical as is."""
    key = subagent_key("Ops")
    parsed = parse_agent_key(key)
    assert parsed is not None
    assert parsed.agent_id == "ops"
    prefix, _, child_id = parsed.rest.partition(":")
    assert prefix == "subagent"
    assert uuid.UUID(child_id).version == 4
    assert canonical_key(key, agent_id="main") == key
    assert subagent_key("ops") != subagent_key("ops")


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("agent:main:subagent:1234", True),
        ("subagent:1234", True),
        ("AGENT:Main:SubAgent:1", True),
        ("agent:main:main", False),
        ("agent:subagent:cron:x", False),
        ("agent:main:cron:subagent:x", False),
    ],
)
def test_is_subagent_key(key: str, expected: bool) -> None:
    """is_subagent_key is true when the (stripped) key starts with subagent:."""
    assert is_subagent_key(key) is expected
