"""Gateway methods over session entries: list, resolve, patch, delete, chat.history and
deliveries.list (``flows.get`` and ``flows.list`` live with the flows, `flows.a2a_flow`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.delivery import deliveries_for
from switchboard.shared.errors import Conflict, InvalidInput, NotFound
from switchboard.shared.gateway.completion import delivery_statuses
from switchboard.shared.gateway.resolve import key_options, resolve_label, resolve_session_ref
from switchboard.shared.runtime.models import validate_model_ref
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms
from switchboard.shared.store.sessions import IndexCursor, SessionEntry

# Assistant messages that are only a control token are hidden from chat history.
_CONTROL_ONLY = re.compile(r"^\s*(NO_REPLY|ANNOUNCE_SKIP|REPLY_SKIP)\s*$", re.IGNORECASE)
# How many index entries a `search` may look through before giving up.
_SEARCH_SCAN_LIMIT = 5000


def session_row(svc: Services, entry: SessionEntry) -> dict[str, Any]:
    """A `sessions.list` row: the entry's fields plus key, kind and channel."""
    opts = key_options(svc)
    kind = sk.session_kind(entry.key, **opts)
    row: dict[str, Any] = {"key": entry.key, "kind": kind}
    row.update({k: v for k, v in entry.fields.items() if v is not None and k != "seq"})
    ctx = entry.get("deliveryContext") or {}
    row["channel"] = sk.derive_channel(
        entry.key,
        kind=kind,
        entry_channel=entry.get("channel"),
        last_channel=ctx.get("channel") or entry.get("lastChannel"),
    )
    row["transcriptPath"] = sk.transcript_url(entry.key)
    return row


def sessions_list_method(svc: Services, params: Mapping[str, Any]) -> dict[str, Any]:
    """Gateway `sessions.list`: newest first, served from the updatedAt indexes."""
    limit = int(params.get("limit") or 50)
    if limit < 1:
        raise InvalidInput("limit must be >= 1", field="limit")
    active = params.get("activeMinutes")
    min_updated = now_ms() - int(active) * 60_000 if active else None
    agent_id = params.get("agentId")
    kinds = params.get("kinds")
    rows: list[dict[str, Any]] = []
    offset = 0
    cursor: IndexCursor | None = None
    search = (params.get("search") or "").strip().lower()
    label = params.get("label")
    spawned_by = params.get("spawnedBy")
    parent: str | None = None
    if label:
        keys = [resolve_label(svc, label, agent_id)]
    elif spawned_by:
        parent = resolve_session_ref(svc, spawned_by)
        keys = list(reversed(svc.store.sessions.children(parent)))
    else:
        keys = None
    while len(rows) < limit and offset < _SEARCH_SCAN_LIMIT:
        if keys is None:
            pairs, cursor = svc.store.sessions.recent_page(
                agent_ids=[agent_id] if agent_id else None,
                kinds=kinds,
                min_updated_ms=min_updated,
                limit=limit if not search else 200,
                after=cursor,
            )
            page = [k for k, _ in pairs]
        else:
            page = keys[offset : offset + limit]
        if not page:
            break
        offset += len(page)
        for entry in svc.store.sessions.get_many(page):
            if entry is None or (min_updated and entry.updated_at_ms < min_updated):
                continue
            row = session_row(svc, entry)
            if search and not _matches(row, search):
                continue
            rows.append(row)
            if len(rows) >= limit:
                break
        if (keys is not None and offset >= len(keys)) or (keys is None and cursor is None):
            break
    if parent is not None and rows:  # children: where each one's completion delivery stands
        statuses = delivery_statuses(svc, [str(r["spawnId"]) for r in rows if r.get("spawnId")])
        for row in rows:
            if status := statuses.get(str(row.get("spawnId"))):
                row["deliveryStatus"] = status
    return {
        "ts": now_ms(),
        "path": str(svc.settings.data_dir / "sessions"),
        "count": len(rows),
        "defaults": {"model": svc.config.model_for(svc.config.default_agent_id())},
        "sessions": rows,
    }


def _matches(row: Mapping[str, Any], needle: str) -> bool:
    hay = (row.get(k) for k in ("displayName", "label", "sessionId", "key"))
    return any(needle in str(v).lower() for v in hay if v)


def sessions_resolve_method(svc: Services, params: Mapping[str, Any]) -> dict[str, Any]:
    """Gateway `sessions.resolve`: exactly one of key, sessionId or label → canonical key."""
    given = [name for name in ("key", "sessionId", "label") if params.get(name)]
    if len(given) > 1:
        raise InvalidInput("Provide either key, sessionId, or label (not multiple)")
    if not given:
        raise InvalidInput("Either key, sessionId, or label is required")
    if given[0] == "label":
        key = resolve_label(svc, params["label"], params.get("agentId"))
    else:
        key = resolve_session_ref(svc, params[given[0]], agent_id=params.get("agentId"))
        if not svc.store.sessions.exists(key):
            raise NotFound(f"No session found: {params[given[0]]}")
    return {"ok": True, "key": key}


_PATCHABLE = {
    "label": str,
    "displayName": str,
    "thinkingLevel": str,
    "verboseLevel": str,
    "sendPolicy": str,
    "model": str,
}


def sessions_patch_method(svc: Services, params: Mapping[str, Any]) -> dict[str, Any]:
    """Gateway `sessions.patch`: set or clear (null) per-session fields."""
    key = resolve_session_ref(svc, params.get("key"))
    fields: dict[str, Any] = {}
    for name in _PATCHABLE:
        if name not in params:
            continue
        value = params[name]
        if isinstance(value, str):
            value = value.strip() or None
        fields[name] = value
    if not fields:
        raise InvalidInput("nothing to patch", field="key")
    policy = fields.get("sendPolicy")
    if policy is not None and policy not in ("allow", "deny"):
        raise InvalidInput('invalid sendPolicy (use "allow"|"deny")', field="sendPolicy")
    if fields.get("model"):
        validate_model_ref(fields["model"], svc.config.models.providers)
    if fields.get("label") and len(fields["label"]) > 512:
        raise InvalidInput("invalid label: too long (max 512)", field="label")
    svc.store.sessions.ensure(key)
    svc.store.sessions.patch(key, fields)
    entry = svc.store.sessions.get(key)
    return {"ok": True, "key": key, "entry": session_row(svc, entry) if entry else {}}


def sessions_delete_method(svc: Services, params: Mapping[str, Any]) -> dict[str, Any]:
    """Gateway `sessions.delete`: remove a session (never the main session) and its transcript."""
    key = resolve_session_ref(svc, params.get("key"))
    opts = key_options(svc)
    if sk.session_kind(key, **opts) == "main":
        raise InvalidInput("Cannot delete the main session", field="key")
    if svc.store.runs.lane_holder(key):
        raise Conflict(f"session has an active run: {key}", field="key")
    deleted = svc.store.sessions.delete(key)
    return {"ok": True, "key": key, "deleted": deleted}


def chat_history_method(svc: Services, params: Mapping[str, Any]) -> dict[str, Any]:
    """Gateway `chat.history`: the last ``limit`` messages (1..1000, default 200), oldest first."""
    key = resolve_session_ref(svc, params.get("sessionKey"))
    limit = int(params.get("limit") or 200)
    if not 1 <= limit <= 1000:
        raise InvalidInput("limit must be between 1 and 1000", field="limit")
    entry = svc.store.sessions.get(key)
    messages = visible_tail(svc, key, limit)
    out: dict[str, Any] = {"sessionKey": key, "messages": messages}
    if entry is not None:
        out["sessionId"] = entry.session_id
        for name in ("thinkingLevel", "verboseLevel"):
            if entry.get(name):
                out[name] = entry.get(name)
    return out


def visible_tail(svc: Services, key: str, limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` messages that are not control-token-only replies, oldest first."""
    fetch = limit
    while True:
        raw = svc.store.transcripts.tail(key, fetch)
        visible = [m for m in raw if not _control_only(m)]
        if len(visible) >= limit or len(raw) < fetch:
            return visible[-limit:]
        fetch *= 2


def _control_only(message: Mapping[str, Any]) -> bool:
    if message.get("role") != "assistant":
        return False
    content = message.get("content")
    if isinstance(content, str):
        return bool(_CONTROL_ONLY.match(content))
    if not isinstance(content, list) or not content:
        return False
    if any(b.get("type") != "text" for b in content if isinstance(b, dict)):
        return False
    text = "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return bool(_CONTROL_ONLY.match(text))


def deliveries_list_method(svc: Services, params: Mapping[str, Any]) -> dict[str, Any]:
    """Gateway `deliveries.list`: recent outbound deliveries of a session and their outcome."""
    key = resolve_session_ref(svc, params.get("sessionKey"))
    rows = deliveries_for(svc, key, limit=int(params.get("limit") or 20))
    return {"sessionKey": key, "count": len(rows), "deliveries": rows}
