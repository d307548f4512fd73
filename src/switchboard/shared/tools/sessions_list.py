"""`sessions_list`: the sessions the caller may see, newest first, served from the indexes.

Where the candidates come from follows the caller's effective visibility, so a listing
never scans the store (SPEC §3): ``self`` reads one entry; ``tree`` the caller plus the
sessions it spawned, transitively (the same set the visibility guard uses, so a listed
child is always readable with ``sessions_history``, unlike OpenClaw #114180); ``agent``
the caller's per-agent updatedAt index (per-kind indexes when ``kinds`` is given); ``all``
the per-agent indexes of the agents agent-to-agent policy can reach, or the global index
when the allow list is open-ended. ``limit`` counts rows after visibility and kind
filtering (**Fix**): index pages are read until enough visible rows are found, up to a
bounded scan. The result carries ``scope`` so a model can tell the list is scoped
(OpenClaw #50646).

Filters (OpenClaw's names): ``label`` (exact) is one read of the label index (labels are
unique), then the visibility check; ``agentId`` (exact) narrows the indexes read to that
agent's (nothing outside visibility is ever read for it); ``search`` (case-insensitive
substring of the key as stored or as shown, the label, the display name or the sessionId,
as the gateway's ``sessions.list`` matches) is a row filter over the same bounded index
scan, so it stops at ``limit`` matches or at the scan bound (``scope.partial``).

Paging and filters of OpenClaw 2026.9.6: ``offset`` skips that many visible rows (the
scan reads ``offset + limit + 1`` of them, so ``hasMore`` is exact within the scan bound;
``nextOffset`` is the offset of the next page); ``activeOnly`` keeps sessions with a run
queued or running; ``excludeSubagents`` drops sub-agent sessions; ``archived``
(``false`` default, ``true``, ``"all"``): an archived sub-agent session is exported to its
transcript file and deleted from the store, so ``true`` lists nothing and ``"all"`` is the
live sessions (the scope note says so). A row's ``status`` is ``queued`` while the
session's latest run waits for a worker.

Message previews (``messageLimit``) go through the same sanitiser as ``sessions_history``
(OpenClaw previews skip redaction, which would make this tool a way round it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.config import SwitchboardConfig
from switchboard.shared.errors import InvalidInput
from switchboard.shared.gateway.resolve import display_key, key_options
from switchboard.shared.gateway.sessions import chat_history_method
from switchboard.shared.policy.visibility import (
    Visibility,
    VisibilityGuard,
    matches_allow,
    spawned_closure,
)
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms
from switchboard.shared.store.sessions import SessionEntry
from switchboard.shared.tools.access import visibility_guard
from switchboard.shared.tools.args import read_bool, read_int, read_string, read_string_list
from switchboard.shared.tools.registry import ToolContext, ToolSpec
from switchboard.shared.tools.sessions_history import (
    TOOL_ROLES,
    sandbox_restricted,
    sanitize_message,
)

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
MAX_MESSAGE_LIMIT = 20
MAX_AGENT_ID_CHARS = 64
# Index entries read per page, and at most per call, while looking for visible rows.
_PAGE_SIZE = 200
_SCAN_LIMIT = 5000
# A preview fetches this many times `messageLimit` messages, so tool results dropped from
# it still leave `messageLimit` messages when the session has them.
_PREVIEW_OVERFETCH = 3
# The latest run's state as the session entry records it → OpenClaw's row status.
_RUN_STATUS = {
    "queued": "queued",
    "running": "running",
    "parked": "running",
    "ok": "done",
    "done": "done",
    "error": "failed",
    "failed": "failed",
    "timeout": "timeout",
    "killed": "killed",
    "cancelled": "killed",
    "lost": "failed",
}
_STRING_FIELDS = ("sessionId", "model", "thinkingLevel", "verboseLevel", "sendPolicy", "label")
_NUMBER_FIELDS = ("updatedAt", "contextTokens", "totalTokens")
_BOOL_FIELDS = ("systemSent", "abortedLastRun")
_DELIVERY_FIELDS = ("channel", "to", "accountId")
_GROUP_SLUG = re.compile(r"[^a-z0-9#@._+\-]+")
_SANDBOX_NOTE = " (sandboxed: agents.defaults.sandbox.sessionToolsVisibility=spawned)"
# The entry statuses of a session with a run in flight (activeOnly).
_ACTIVE_STATUSES = frozenset({"queued", "running", "parked"})
ARCHIVED_ERROR = 'archived must be true, false, or "all"'
_ARCHIVED_NOTE = (
    " Archived sub-agent sessions are exported to transcript files and leave the store, "
    "so none is listed."
)


@dataclass(frozen=True)
class ListQuery:
    """The filters of one call, already normalised (``search`` lower-cased)."""

    kinds: frozenset[str] | None
    limit: int
    min_updated_ms: int | None
    message_limit: int
    label: str | None = None
    agent_id: str | None = None
    search: str | None = None
    offset: int = 0
    active_only: bool = False
    exclude_subagents: bool = False
    archived: bool | str = False

    @property
    def wanted(self) -> int:
        """Visible rows to find: this page, the ones skipped before it, and one more
        (which says whether there is a next page)."""
        return self.offset + self.limit + 1

    def accepts(self, entry: SessionEntry, kind: str, names: Callable[[], Iterable[str]]) -> bool:
        """Every filter but visibility (decided separately). ``names`` gives the texts
        ``search`` looks in; it is only called when there is a search."""
        if self.kinds is not None and kind not in self.kinds:
            return False
        if self.min_updated_ms is not None and entry.updated_at_ms < self.min_updated_ms:
            return False
        if self.label is not None and entry.get("label") != self.label:
            return False
        if self.agent_id is not None and sk.agent_id_of(entry.key) != self.agent_id:
            return False
        if self.active_only and str(entry.get("status")) not in _ACTIVE_STATUSES:
            return False
        if self.exclude_subagents and sk.is_subagent_key(entry.key):
            return False
        return self.search is None or search_hit(self.search, names())

    @property
    def filters_rows(self) -> bool:
        """True when many rows of the indexes read may fail the query (a ``search``), so a
        page should be read whole, not just ``limit`` rows of it (``label`` never pages)."""
        return self.search is not None or self.active_only or self.exclude_subagents


@dataclass
class _Found:
    """Entries found for a listing, and whether the bounded scan stopped early."""

    entries: list[SessionEntry]
    partial: bool = False


def search_hit(needle: str, names: Iterable[str]) -> bool:
    """True when the lower-case ``needle`` is a substring of one of ``names``, any case."""
    return any(needle in name.lower() for name in names if name)


def read_query(args: Mapping[str, Any]) -> ListQuery:
    """The call's filters from its arguments (OpenClaw's names and limits)."""
    kinds = {k.lower() for k in read_string_list(args, "kinds") or []} & set(sk.KINDS)
    active = read_int(args, "activeMinutes", default=None, lo=1)
    agent_id = read_string(args, "agentId")
    if agent_id is not None and len(agent_id) > MAX_AGENT_ID_CHARS:
        raise InvalidInput(
            f"agentId must be at most {MAX_AGENT_ID_CHARS} characters", field="agentId"
        )
    search = read_string(args, "search")
    offset = read_int(args, "offset", default=0, lo=0, hi=_SCAN_LIMIT) or 0
    return ListQuery(
        kinds=frozenset(kinds) or None,
        limit=read_int(args, "limit", default=DEFAULT_LIMIT, lo=1, hi=MAX_LIMIT) or DEFAULT_LIMIT,
        min_updated_ms=now_ms() - active * 60_000 if active else None,
        message_limit=read_int(args, "messageLimit", default=0, lo=0, hi=MAX_MESSAGE_LIMIT) or 0,
        label=read_string(args, "label"),
        # Agent ids are case-insensitive (stored lower-case); otherwise matched exactly.
        agent_id=agent_id.lower() if agent_id is not None else None,
        search=search.lower() if search is not None else None,
        offset=offset,
        active_only=read_bool(args, "activeOnly"),
        exclude_subagents=read_bool(args, "excludeSubagents"),
        archived=_read_archived(args),
    )


def _read_archived(args: Mapping[str, Any]) -> bool | str:
    """``archived``: true, false (default) or "all"."""
    value = args.get("archived", False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "all"):
        text = value.strip().lower()
        return text if text == "all" else text == "true"
    raise InvalidInput(ARCHIVED_ERROR, field="archived")


def _sessions_list(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    svc = ctx.services
    query = read_query(args)
    guard = visibility_guard(ctx)
    reach = _agents_in_reach(svc.config, ctx.agent_id)
    found = _candidates(ctx, guard, reach, query) if query.archived is not True else _Found([])
    page = found.entries[query.offset : query.offset + query.limit]
    has_more = len(found.entries) > query.offset + query.limit
    rows = []
    for entry in page:
        row = list_row(svc, entry, ctx.agent_id)
        if query.message_limit > 0:
            row["messages"] = _preview(svc, entry.key, query.message_limit)
        rows.append(row)
    scope = _scope(ctx, guard.visibility, reach)
    if found.partial:
        scope["partial"] = True
    if query.archived is not False:
        scope["note"] += _ARCHIVED_NOTE
    result: dict[str, Any] = {"count": len(rows), "sessions": rows, "offset": query.offset}
    result["hasMore"] = has_more
    if has_more:
        result["nextOffset"] = query.offset + len(rows)
    return result | {"scope": scope}


def visible_sessions(ctx: ToolContext, limit: int) -> tuple[list[SessionEntry], bool]:
    """The ``limit`` most recently updated sessions the caller may see (the listing's
    sources, no filter), and whether more visible sessions exist beyond them."""
    query = ListQuery(kinds=None, limit=limit, min_updated_ms=None, message_limit=0)
    guard = visibility_guard(ctx)
    found = _candidates(ctx, guard, _agents_in_reach(ctx.services.config, ctx.agent_id), query)
    return found.entries[:limit], found.partial or len(found.entries) > limit


def _candidates(
    ctx: ToolContext, guard: VisibilityGuard, reach: list[str] | None, query: ListQuery
) -> _Found:
    """The visible entries matching the query, newest first, at most ``query.wanted``."""
    svc = ctx.services
    if query.label is not None:
        # Labels are unique: one index read, then the same visibility check as any row.
        key = svc.store.sessions.key_for_label(query.label)
        keys = [key] if key is not None and guard.check(key, "list").allowed else []
        return _from_keys(svc, keys, query, ctx.agent_id)
    if guard.visibility == "self":
        return _from_keys(svc, [ctx.session_key], query, ctx.agent_id)
    if guard.visibility == "tree":
        # Exactly the set the guard allows under `tree`: the caller and its spawned closure.
        spawned = spawned_closure(ctx.session_key, svc.store.sessions.children)
        return _from_keys(svc, [ctx.session_key, *sorted(spawned)], query, ctx.agent_id)
    agents = [ctx.agent_id] if guard.visibility == "agent" else reach
    if query.agent_id is not None:
        if agents is not None and query.agent_id not in agents:
            return _Found([])  # that agent's sessions are out of reach: nothing to read
        agents = [query.agent_id]
    return _from_indexes(ctx, guard, agents, query)


def _from_keys(svc: Services, keys: list[str], query: ListQuery, requester_agent: str) -> _Found:
    """Entries of known keys (self, tree, a label), filtered, sorted by updatedAt, limited."""
    kind_of = _kind_function(svc)
    entries = []
    for entry in svc.store.sessions.get_many(keys):
        if entry is None or not _listable(svc, entry.key):
            continue
        kind = kind_of(entry.key)
        if query.accepts(entry, kind, _names_of(svc, entry, kind, requester_agent)):
            entries.append(entry)
    entries.sort(key=lambda e: e.updated_at_ms, reverse=True)
    return _Found(entries[: query.wanted])


def _from_indexes(
    ctx: ToolContext, guard: VisibilityGuard, agents: list[str] | None, query: ListQuery
) -> _Found:
    """Page through the updatedAt indexes until ``query.wanted`` visible rows are found.

    ``agents`` None means the global index (kinds then filtered per row); otherwise the
    per-agent indexes, or their per-kind indexes when kinds are given.
    """
    svc = ctx.services
    kind_of = _kind_function(svc)
    kinds = sorted(query.kinds) if query.kinds is not None and agents is not None else None
    out: list[SessionEntry] = []
    scanned = 0
    partial = False
    # The first page asks for just what is wanted (usually all visible), with the entries
    # in the same round trip; later pages ask for more. A row filter (search) reads whole
    # pages from the start: most rows may fail it.
    first = _PAGE_SIZE if query.filters_rows else min(query.wanted + 1, _PAGE_SIZE)
    page, entries, cursor = svc.store.sessions.recent_entries(
        agent_ids=agents,
        kinds=kinds,
        min_updated_ms=query.min_updated_ms,
        limit=first,
    )
    seen = {key for key, _ in page}
    while True:
        scanned += len(page)
        for entry in entries:
            if entry is None or not _listable(svc, entry.key):
                continue
            kind = kind_of(entry.key)
            names = _names_of(svc, entry, kind, ctx.agent_id)
            if query.accepts(entry, kind, names) and guard.check(entry.key, "list").allowed:
                out.append(entry)
        if cursor is None or len(out) >= query.wanted:
            break
        if scanned >= _SCAN_LIMIT:
            partial = True
            break
        page, cursor = svc.store.sessions.recent_page(
            agent_ids=agents,
            kinds=kinds,
            min_updated_ms=query.min_updated_ms,
            limit=_PAGE_SIZE,
            after=cursor,
        )
        fresh = [key for key, _ in page if key not in seen]
        seen.update(fresh)
        entries = svc.store.sessions.get_many(fresh)
    # Transcript appends move an entry's updatedAt ahead of its index score; show the truth.
    out.sort(key=lambda e: e.updated_at_ms, reverse=True)
    return _Found(out[: query.wanted], partial=partial)


def _agents_in_reach(config: SwitchboardConfig, own: str) -> list[str] | None:
    """The agents whose sessions `all` can show: listed ids, or None for "any agent"."""
    policy = config.tools.agent_to_agent
    if not policy.enabled or not matches_allow(policy.allow, own):
        return [own]
    patterns = [p.strip() for p in policy.allow if p.strip()]
    if not patterns or any("*" in p for p in patterns):
        return None
    return sorted({own, *patterns})


def _names_of(
    svc: Services, entry: SessionEntry, kind: str, requester_agent: str
) -> Callable[[], list[str]]:
    """What ``search`` looks in for one entry: its key as stored and as the caller sees it,
    its label, its display name (as the row shows it) and its sessionId."""

    def names() -> list[str]:
        channel = sk.derive_channel(
            entry.key,
            kind=kind,
            entry_channel=_text(entry.get("channel")),
            last_channel=_text(_delivery_context(entry.get("deliveryContext")).get("channel"))
            or _text(entry.get("lastChannel")),
        )
        return [
            entry.key,
            display_key(svc, entry.key, requester_agent),
            _text(entry.get("label")) or "",
            _display_name(entry, kind, channel) or "",
            entry.session_id,
        ]

    return names


def _kind_function(svc: Services) -> Callable[[str], str]:
    opts = key_options(svc)
    return lambda key: sk.session_kind(key, **opts)


def _listable(svc: Services, key: str) -> bool:
    """`unknown` never, `global` only as the main session under scope global."""
    if key == "unknown":
        return False
    return key != "global" or svc.config.session.scope == "global"


def list_row(svc: Services, entry: SessionEntry, requester_agent: str) -> dict[str, Any]:
    """One `sessions_list` row (SPEC §3): known fields only, keys as the caller sees them.

    Built field by field, leaving out what is unset (a listing builds fifty per call)."""
    fields = entry.fields
    kind = sk.session_kind(entry.key, **key_options(svc))
    delivery = _delivery_context(fields.get("deliveryContext"))
    last_channel = _text(delivery.get("channel")) or _text(fields.get("lastChannel"))
    channel = sk.derive_channel(
        entry.key, kind=kind, entry_channel=_text(fields.get("channel")), last_channel=last_channel
    )
    row: dict[str, Any] = {
        "key": display_key(svc, entry.key, requester_agent),
        "kind": kind,
        "channel": channel,
    }
    if name := _display_name(entry, kind, channel):
        row["displayName"] = name
    if last_channel:
        row["lastChannel"] = last_channel
    if last_to := _text(delivery.get("to")) or _text(fields.get("lastTo")):
        row["lastTo"] = last_to
    if delivery:
        row["deliveryContext"] = delivery
    if status := _RUN_STATUS.get(str(fields.get("status"))):
        row["status"] = status
    for field in _STRING_FIELDS:
        if text := _text(fields.get(field)):
            row[field] = text
    for field in _NUMBER_FIELDS:
        number = fields.get(field)
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            row[field] = number
    for field in _BOOL_FIELDS:
        flag = fields.get(field)
        if isinstance(flag, bool):
            row[field] = flag
    row["transcriptPath"] = sk.transcript_url(entry.key)
    if parent := _text(fields.get("spawnedBy")):
        row["spawnedBy"] = display_key(svc, parent, requester_agent)
    return row


def _delivery_context(value: Any) -> dict[str, str]:
    """The entry's delivery route: channel, to, accountId (those that are set)."""
    if not isinstance(value, Mapping):
        return {}
    found = {name: _text(value.get(name)) for name in _DELIVERY_FIELDS}
    return {name: item for name, item in found.items() if item}


def _display_name(entry: SessionEntry, kind: str, channel: str) -> str | None:
    """The entry's own name, else a group label like `discord:g-dev`, else its label."""
    own = _text(entry.get("displayName"))
    if own:
        return own
    if kind == "group" and channel != "unknown":
        token = _text(entry.get("subject")) or _text(entry.get("groupChannel"))
        token = token or _group_id(entry.key)
        if token:
            return f"{channel}:{_group_token(token)}"
    return _text(entry.get("label"))


def _group_id(key: str) -> str | None:
    """What follows the `group`/`channel` marker of a group key."""
    parts = sk.strip_agent_prefix(key).split(":")
    for index, part in enumerate(parts[:-1]):
        if part in ("group", "channel"):
            return ":".join(parts[index + 1 :])
    return None


def _group_token(token: str) -> str:
    """OpenClaw's group label token: a slug, `g-` prefixed unless it is `@x`, `#x` or `g-x`."""
    slug = _GROUP_SLUG.sub("-", token.strip().lower()).strip("-")
    if slug.startswith(("@", "#", "g-")) or "#" in slug:
        return slug
    return f"g-{slug}"


def _preview(svc: Services, key: str, count: int) -> list[dict[str, Any]]:
    """The last ``count`` messages of a session, tool results dropped, sanitised."""
    limit = min(count * _PREVIEW_OVERFETCH, 1000)
    history = chat_history_method(svc, {"sessionKey": key, "limit": limit})
    kept = [m for m in history["messages"] if m.get("role") not in TOOL_ROLES][-count:]
    return [sanitize_message(m).message for m in kept]


def _scope(
    ctx: ToolContext, visibility: Visibility, reach: Collection[str] | None
) -> dict[str, Any]:
    """Which sessions this listing can show, in words a model can act on."""
    scope: dict[str, Any] = {"visibility": visibility}
    note = _scope_note(visibility, ctx.agent_id, reach)
    if sandbox_restricted(ctx):
        scope["sandboxed"] = True
        note = note.removesuffix(".") + _SANDBOX_NOTE + "."
    scope["note"] = note
    return scope


def _scope_note(visibility: Visibility, agent: str, reach: Collection[str] | None) -> str:
    if visibility == "self":
        return "Only this session is listed (tools.sessions.visibility=self)."
    if visibility == "tree":
        return (
            "Only this session and the sessions it spawned are listed "
            "(tools.sessions.visibility=tree)."
        )
    if visibility == "agent":
        return f"Only sessions of agent {agent} are listed (tools.sessions.visibility=agent)."
    if reach is not None and list(reach) == [agent]:
        return (
            f"Only sessions of agent {agent} are listed: other agents' sessions need "
            "tools.agentToAgent.enabled=true and both agents in tools.agentToAgent.allow."
        )
    return "Sessions of every agent that tools.agentToAgent.allow permits are listed."


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


SPEC = ToolSpec(
    name="sessions_list",
    description=(
        "List visible sessions with optional filters for kind, recent activity, label, "
        "agent, a text search, and last messages. Use this to discover a target session "
        "before calling sessions_history or sessions_send."
    ),
    parameters={
        "type": "object",
        "properties": {
            "kinds": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Only these kinds: main, group, cron, hook, node, other.",
            },
            "limit": {
                "type": "number",
                "minimum": 1,
                "description": "Max sessions to return (default 50, at most 200).",
            },
            "activeMinutes": {
                "type": "number",
                "minimum": 1,
                "description": "Only sessions active within the last N minutes.",
            },
            "messageLimit": {
                "type": "number",
                "minimum": 0,
                "description": "Include the last N messages of each session (0-20, default 0).",
            },
            "label": {
                "type": "string",
                "minLength": 1,
                "description": "Only the session with exactly this label.",
            },
            "agentId": {
                "type": "string",
                "minLength": 1,
                "maxLength": 64,
                "description": "Only sessions of this agent id.",
            },
            "offset": {
                "type": "number",
                "minimum": 0,
                "description": "Skip this many sessions (paging: pass the previous nextOffset).",
            },
            "activeOnly": {
                "type": "boolean",
                "description": "Only sessions with a run queued or running.",
            },
            "excludeSubagents": {
                "type": "boolean",
                "description": "Leave out sub-agent sessions.",
            },
            "archived": {
                "anyOf": [{"type": "boolean"}, {"type": "string", "enum": ["all"]}],
                "description": 'false (default): live sessions; true: archived only; "all".',
            },
            "search": {
                "type": "string",
                "minLength": 1,
                "description": (
                    "Only sessions whose key, label, display name or sessionId contains "
                    "this text (case-insensitive)."
                ),
            },
        },
    },
    handler=_sessions_list,
)
