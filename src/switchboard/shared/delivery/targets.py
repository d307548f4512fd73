"""Where a session's announces go (OpenClaw ``resolveAnnounceTarget``, reference §5.7).

A group or channel key names its own chat (``<channel>:group:<id>[:thread:<t>]`` →
``{channel, to: "group:<id>", threadId}``). Any other session is reached through what
its entry recorded: ``deliveryContext``, else ``lastChannel``/``lastTo``/…, else ``origin``.
A platform channel needs a ``to``; ``webchat`` does not (the console shows the session).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import EllipsisType
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.delivery.records import Target
from switchboard.shared.services import Services
from switchboard.shared.store.sessions import SessionEntry

_CONVERSATION_KINDS = frozenset({"group", "channel"})
_THREAD_MARKERS = frozenset({"thread", "topic"})


def resolve_announce_target(
    svc: Services, session_key: str, *, entry: SessionEntry | EllipsisType | None = ...
) -> Target | None:
    """The chat a session's announces are delivered to, or None when it has none.

    ``entry`` is the session's entry when the caller has just read it (``...``: read it
    here, if the key itself names no chat)."""
    from_key = target_from_key(session_key)
    if from_key is not None:
        return from_key
    if isinstance(entry, EllipsisType):
        entry = svc.store.sessions.get(session_key)
    return target_from_entry(entry.fields) if entry is not None else None


def target_from_key(session_key: str) -> Target | None:
    """The chat a group/channel key names, else None."""
    parts = sk.strip_agent_prefix(session_key.strip().lower()).split(":")
    if len(parts) < 3 or not parts[0] or parts[1] not in _CONVERSATION_KINDS:
        return None
    rest = parts[2:]
    thread_id = None
    for index, part in enumerate(rest):
        if index > 0 and part in _THREAD_MARKERS and index + 1 < len(rest):
            thread_id = ":".join(rest[index + 1 :])
            rest = rest[:index]
            break
    conversation = ":".join(rest)
    if not conversation:
        return None
    return Target(channel=parts[0], to=f"{parts[1]}:{conversation}", thread_id=thread_id)


def target_from_entry(fields: Mapping[str, Any]) -> Target | None:
    """The chat recorded on a session entry (delivery context, last route, origin)."""
    ctx = _mapping(fields.get("deliveryContext"))
    origin = _mapping(fields.get("origin"))
    channel = _text(ctx.get("channel")) or _text(fields.get("lastChannel"))
    channel = channel or _text(origin.get("provider"))
    to = _text(ctx.get("to")) or _text(fields.get("lastTo"))
    if not channel or (not to and channel != "webchat"):
        return None
    account = _text(ctx.get("accountId")) or _text(fields.get("lastAccountId"))
    thread = _text(ctx.get("threadId")) or _text(fields.get("lastThreadId"))
    return Target(
        channel=channel.lower(),
        to=to,
        account_id=account or _text(origin.get("accountId")),
        thread_id=thread or _text(origin.get("threadId")),
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip()
    return text or None
