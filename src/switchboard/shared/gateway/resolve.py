"""Turning what a caller typed (a key, `main`, `current`, a sessionId, a label) into a key."""

from __future__ import annotations

from switchboard.shared import keys as sk
from switchboard.shared.errors import InvalidInput, NotFound
from switchboard.shared.services import Services


def key_options(svc: Services) -> dict[str, str]:
    """The main-key settings every key function takes."""
    return {"main_key": svc.config.session.main_key, "scope": svc.config.session.scope}


def resolve_session_ref(
    svc: Services,
    raw: str | None,
    *,
    agent_id: str | None = None,
    requester_key: str | None = None,
) -> str:
    """The canonical key for a session reference; unknown sessionIds are an error.

    ``agent_id`` is the agent bare keys and ``main`` belong to (default: the requester's
    agent, else the default agent). ``current`` means the requester's own session.
    """
    value = (raw or "").strip()
    if requester_key is not None and agent_id is None:
        agent_id = sk.agent_id_of(requester_key)
    agent = agent_id or svc.config.default_agent_id()
    if not value:
        value = "main"
    if value.lower() == "current":
        if requester_key is None:
            raise InvalidInput("sessionKey 'current' needs a calling session", field="sessionKey")
        return requester_key
    if sk.looks_like_session_id(value):
        found = svc.store.sessions.key_for_session_id(value.strip().lower())
        if found is None:
            raise NotFound(
                f"Session not found: {value} (use the full sessionKey from sessions_list)",
                field="sessionKey",
            )
        return found
    return sk.canonical_key(value, agent_id=agent, **key_options(svc))


def display_key(svc: Services, key: str, requester_agent_id: str | None = None) -> str:
    """How a key is shown to a caller of ``requester_agent_id`` (its own main is `main`)."""
    agent = requester_agent_id or svc.config.default_agent_id()
    return sk.display_key(key, agent_id=agent, **key_options(svc))


def resolve_label(svc: Services, label: str, agent_id: str | None = None) -> str:
    """The key carrying a label (optionally within one agent)."""
    text = label.strip()
    if not text:
        raise InvalidInput("invalid label: empty", field="label")
    if len(text) > 512:
        raise InvalidInput("invalid label: too long (max 512)", field="label")
    key = svc.store.sessions.key_for_label(text)
    if key is None or (agent_id is not None and sk.agent_id_of(key) != agent_id):
        raise NotFound(f"No session found with label: {text}", field="label")
    return key
