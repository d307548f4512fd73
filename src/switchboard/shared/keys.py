"""The session key model: parse, validate, canonicalise and classify session keys (no I/O).

Canonical keys are lower-case ``agent:<agentId>:<rest>``; ``global`` (the main session under
``session.scope = "global"``) and ``unknown`` are the only reserved bare keys. Callers see
their own main session as ``"main"`` (see ``display_key``).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal
from urllib.parse import quote

from switchboard.shared.errors import InvalidInput

AGENT_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
MAX_KEY_LENGTH = 512
DEFAULT_AGENT_ID = "main"
DEFAULT_MAIN_KEY = "main"
RESERVED_KEYS = frozenset({"global", "unknown"})

SessionKind = Literal["main", "group", "cron", "hook", "node", "other"]
KINDS: tuple[str, ...] = ("main", "group", "cron", "hook", "node", "other")
ChatType = Literal["direct", "group", "channel", "unknown"]

SESSION_ID_PATTERN = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE
)

# The characters a key may hold. Wide enough for real channel ids (WhatsApp `123@g.us`,
# Slack `#general`, phone numbers `+4917…`, base64-ish ids with `=` and `/`, domains with
# `.`), narrow enough to keep keys safe as Redis key parts and log fields: no whitespace,
# quotes or backslashes, no glob characters (`*?[]`) that would turn a key into a SCAN
# pattern, no `{}` (Redis Cluster hash tags), no non-ASCII look-alikes.
_SAFE_KEY = re.compile(r"[a-zA-Z0-9:_\-.@#+=/]+")
_UNSAFE_CHAR = re.compile(r"[^a-zA-Z0-9:_\-.@#+=/]")
_WHITESPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")
_INVALID_ID_RUN = re.compile(r"[^a-z0-9_-]+")
_WHATSAPP_GROUP = re.compile(r"(?:whatsapp:)?[^:]+@g\.us")
_DISCORD_GUILD_CHANNEL = re.compile(r"discord:(?:[^:]+:)?guild-[^:]+:channel-[^:]+")
_INTERNAL_KINDS = frozenset({"cron", "hook", "node"})
_PEER_MARKERS = frozenset({"group", "channel", "direct"})
_SAFE_CHARS_HINT = "letters, digits and : _ - . @ # + = /"


@dataclass(frozen=True)
class ParsedKey:
    """An ``agent:<agent_id>:<rest>`` key split into its parts (both lower-case)."""

    agent_id: str
    rest: str


def format_key(agent_id: str, rest: str) -> str:
    """Join an agent id and a rest into ``agent:<agent_id>:<rest>`` (no validation)."""
    return f"agent:{agent_id}:{rest}"


def is_valid_agent_id(value: str) -> bool:
    """Tell whether ``value`` (trimmed, any case) is a strictly valid agent id."""
    return AGENT_ID_PATTERN.fullmatch(value.strip().lower()) is not None


def normalize_agent_id(value: str | None) -> str:
    """Turn any string into a valid agent id, leniently; empty or None gives ``"main"``."""
    trimmed = (value or "").strip()
    if is_valid_agent_id(trimmed):
        return trimmed.lower()
    slug = _INVALID_ID_RUN.sub("-", trimmed.lower())
    # `_` may not start an id either, so strip it along with `-` (OpenClaw only strips `-`
    # and can produce an invalid id such as `_x`).
    slug = slug.lstrip("-_").rstrip("-")[:64]
    return slug or DEFAULT_AGENT_ID


def normalize_main_key(value: str | None) -> str:
    """Lower-case and trim ``session.mainKey``; empty or None gives ``"main"``."""
    return (value or "").strip().lower() or DEFAULT_MAIN_KEY


@lru_cache(maxsize=16_384)  # keys are parsed on every hot path; ParsedKey is frozen
def parse_agent_key(key: str) -> ParsedKey | None:
    """Split ``agent:<id>:<rest>`` (any case) into its parts, or None if it is not one."""
    parts = key.strip().lower().split(":", 2)
    if len(parts) != 3 or parts[0] != "agent" or not parts[2]:
        return None
    if AGENT_ID_PATTERN.fullmatch(parts[1]) is None:
        return None
    return ParsedKey(agent_id=parts[1], rest=parts[2])


def main_session_key(agent_id: str, main_key: str = "main", scope: str = "per-sender") -> str:
    """Return the internal key of an agent's main session (``global`` under scope global)."""
    if scope == "global":
        return "global"
    return format_key(normalize_agent_id(agent_id), normalize_main_key(main_key))


def canonical_key(
    raw: str, *, agent_id: str, main_key: str = "main", scope: str = "per-sender"
) -> str:
    """Turn a caller-supplied session key into its canonical store key, or raise InvalidInput.

    ``current`` and session ids must be resolved by the caller before this is called.
    """
    key = raw.strip()
    _check_key_text(key)
    lowered = key.lower()
    main = normalize_main_key(main_key)
    if lowered == "current":
        raise _invalid("sessionKey 'current' must be resolved to the caller's session first")
    if lowered in {"main", main} or (lowered == "global" and scope == "global"):
        return main_session_key(agent_id, main, scope)
    if lowered in RESERVED_KEYS:
        raise _invalid(f"sessionKey '{lowered}' is reserved")
    if lowered.startswith("agent:"):
        canonical = _canonical_agent_key(lowered, main, scope)
    else:
        canonical = format_key(normalize_agent_id(agent_id), lowered)
    _check_length(canonical)
    return canonical


def display_key(
    key: str, *, agent_id: str, main_key: str = "main", scope: str = "per-sender"
) -> str:
    """Show the caller's own main session (and ``global``) as ``"main"``; others unchanged."""
    return "main" if key.strip().lower() in _own_main_names(agent_id, main_key) else key


@lru_cache(maxsize=256)
def _own_main_names(agent_id: str, main_key: str) -> frozenset[str]:
    """The keys that name an agent's own main session (a listing asks once per row)."""
    main = normalize_main_key(main_key)
    return frozenset({"main", main, "global", main_session_key(agent_id, main, "per-sender")})


def agent_id_of(key: str) -> str:
    """Return the agent id of an ``agent:`` key, else the default agent ``"main"``."""
    parsed = parse_agent_key(key)
    return parsed.agent_id if parsed else DEFAULT_AGENT_ID


def strip_agent_prefix(key: str) -> str:
    """Return the rest of an ``agent:<id>:<rest>`` key (lower-case), else the key unchanged."""
    parsed = parse_agent_key(key)
    return parsed.rest if parsed else key


@lru_cache(maxsize=16_384)
def session_kind(key: str, *, main_key: str = "main", scope: str = "per-sender") -> SessionKind:
    """Classify a key as main/group/cron/hook/node/other, judged after ``agent:<id>:``.

    ``global`` is the main session whatever ``scope`` says: under per-sender it is a
    reserved sentinel that is never listed, so no real session is misclassified.
    """
    lowered = key.strip().lower()
    rest = strip_agent_prefix(lowered)
    if lowered == "global" or rest == normalize_main_key(main_key):
        return "main"
    if rest.startswith("cron:"):
        return "cron"
    if rest.startswith("hook:"):
        return "hook"
    if rest.startswith(("node-", "node:")):
        return "node"
    if {"group", "channel"} & set(rest.split(":")):
        return "group"
    return "other"


def chat_type(key: str, *, main_key: str = "main") -> ChatType:
    """Derive the chat type (direct/group/channel/unknown) from a key's tokens."""
    lowered = key.strip().lower()
    rest = strip_agent_prefix(lowered)
    if lowered == "global" or rest == normalize_main_key(main_key):
        return "direct"
    tokens = set(rest.split(":"))
    if "group" in tokens:
        return "group"
    if "channel" in tokens:
        return "channel"
    if tokens & {"direct", "dm"}:
        return "direct"
    return _legacy_chat_type(rest)


def key_channel(key: str) -> str | None:
    """Return ``<channel>`` of a ``<channel>:<group|channel|direct>:…`` rest, else None."""
    segments = strip_agent_prefix(key.strip().lower()).split(":")
    if len(segments) >= 3 and segments[1] in _PEER_MARKERS and segments[0]:
        return segments[0]
    # per-account-channel-peer DMs: `<channel>:<accountId>:direct:<peer>`.
    if len(segments) >= 4 and segments[2] == "direct" and segments[0]:
        return segments[0]
    return None


def derive_channel(
    key: str,
    *,
    kind: str,
    entry_channel: str | None = None,
    last_channel: str | None = None,
) -> str:
    """Return the channel a session row shows: internal, the group's, the DM's, or unknown."""
    if kind in _INTERNAL_KINDS:
        return "internal"
    entry = _clean_channel(entry_channel)
    last = _clean_channel(last_channel)
    if kind == "group":
        return entry or key_channel(key) or "unknown"
    return last or key_channel(key) or "unknown"


def looks_like_session_id(value: str) -> bool:
    """Tell whether ``value`` (trimmed, any case) is a UUID session id."""
    return SESSION_ID_PATTERN.fullmatch(value.strip()) is not None


def new_session_id() -> str:
    """Return a fresh session id (a random UUID4 string)."""
    return str(uuid.uuid4())


def subagent_key(agent_id: str, uid: str | None = None) -> str:
    """Return an ``agent:<id>:subagent:<uid>`` key for a spawned sub-agent (``uid``: a
    fresh UUID4 unless given)."""
    return format_key(normalize_agent_id(agent_id), f"subagent:{uid or new_session_id()}")


def is_subagent_key(key: str) -> bool:
    """Tell whether a key (bare or agent-prefixed) names a sub-agent session."""
    return strip_agent_prefix(key.strip().lower()).startswith("subagent:")


def batch_line_key(agent_id: str, batch_id: str, line: int) -> str:
    """Return the ``agent:<id>:batch:<batchId>:<n>`` key of one line of a Batches API batch."""
    return format_key(normalize_agent_id(agent_id), f"batch:{batch_id}:{line}")


def is_batch_line_key(key: str) -> bool:
    """Tell whether a key (bare or agent-prefixed) names a batch line's own session."""
    return strip_agent_prefix(key.strip().lower()).startswith("batch:batch_")


def transcript_url(key: str) -> str:
    """The api path serving a session's transcript as JSONL (`transcriptPath`), key quoted."""
    return f"/sessions/{quote(key, safe='')}/transcript.jsonl"


def _check_key_text(key: str) -> None:
    """Reject empty, over-long, whitespace-holding or unsafe-character keys."""
    if not key:
        raise _invalid("sessionKey is empty")
    _check_length(key)
    if _WHITESPACE_OR_CONTROL.search(key):
        raise _invalid("sessionKey must not contain whitespace or control characters")
    if _SAFE_KEY.fullmatch(key) is None:
        shown = ", ".join(repr(ch) for ch in sorted(set(_UNSAFE_CHAR.findall(key))))
        raise _invalid(f"sessionKey has illegal characters {shown}; allowed: {_SAFE_CHARS_HINT}")
    if "" in key.split(":"):
        raise _invalid(f"sessionKey '{key}' has an empty segment (leading, trailing or '::')")


def _check_length(key: str) -> None:
    """Reject keys longer than MAX_KEY_LENGTH."""
    if len(key) > MAX_KEY_LENGTH:
        raise _invalid(f"sessionKey is too long ({len(key)} > {MAX_KEY_LENGTH} characters)")


def _canonical_agent_key(lowered: str, main: str, scope: str) -> str:
    """Validate an ``agent:`` key and collapse its main aliases to the main session key."""
    parsed = parse_agent_key(lowered)
    if parsed is None:
        raise _invalid(
            f"malformed session key '{lowered}': expected agent:<agentId>:<rest> "
            "with agentId matching [a-z0-9][a-z0-9_-]{0,63}"
        )
    if parsed.rest in {"main", main}:
        return main_session_key(parsed.agent_id, main, scope)
    return lowered


def _legacy_chat_type(rest: str) -> ChatType:
    """Recognise legacy key shapes: WhatsApp ``…@g.us`` groups and Discord guild channels."""
    if _WHATSAPP_GROUP.fullmatch(rest):
        return "group"
    if _DISCORD_GUILD_CHANNEL.fullmatch(rest):
        return "channel"
    return "unknown"


def _clean_channel(value: str | None) -> str | None:
    """Trim and lower-case a channel name; empty becomes None."""
    cleaned = (value or "").strip().lower()
    return cleaned or None


def _invalid(message: str) -> InvalidInput:
    """Build the InvalidInput every key check raises."""
    return InvalidInput(message, field="sessionKey")
