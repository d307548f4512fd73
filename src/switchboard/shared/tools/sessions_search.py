"""`sessions_search`: find messages by text in the sessions the caller may see (OpenClaw
2026.9.6).

A bounded scan, no index: appends cost nothing extra, and a search reads at most
``SCAN_SESSIONS`` visible sessions (the most recently updated first, from the same indexes
``sessions_list`` reads, so visibility scopes the read itself) and the newest
``SCAN_MESSAGES`` messages of each, matched on the Redis side (`store.search`); with
``sessionKey`` one session, its newest ``ONE_SESSION_MESSAGES``. When the scan stopped with
sessions or messages left unread, the answer says ``truncated`` and how to narrow it.

Matching: the query's words (at most ``MAX_TERMS``), case-insensitive; a message matches
when its text holds one of them (tool results and other roles are not searched). ``score``
is the share of the words found, plus 1 when the whole query appears as typed. Hits are
ordered by score, then newest first; snippets (at most 300 chars around the first match)
are redacted like ``sessions_history``, and the answer stays under 32 KiB.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from switchboard.redact import redact_text
from switchboard.shared.errors import InvalidInput, NotFound
from switchboard.shared.gateway.resolve import display_key, resolve_session_ref
from switchboard.shared.store.search import Candidate
from switchboard.shared.tools.access import visibility_guard
from switchboard.shared.tools.args import read_int, read_string
from switchboard.shared.tools.registry import ToolContext, ToolSpec
from switchboard.shared.tools.sessions_history import forbidden_result
from switchboard.shared.tools.sessions_list import visible_sessions

MAX_QUERY_CHARS = 4096
DEFAULT_LIMIT = 10
MAX_LIMIT = 25
MAX_SNIPPET_CHARS = 300
MAX_RESULT_BYTES = 32 * 1024
MAX_TERMS = 8
SCAN_SESSIONS = 200
SCAN_MESSAGES = 100
ONE_SESSION_MESSAGES = 2000
# Candidates read per hit wanted: a candidate may be a tool result, or match only in JSON
# keys, and then does not count.
_READ_FACTOR = 4
_ROLES = ("user", "assistant")
_WORD = re.compile(r"\w+")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _terms(query: str) -> list[str]:
    """The distinct lower-case words of the query (the whole query when it has none)."""
    words = list(dict.fromkeys(_WORD.findall(query.lower())))
    longer = [w for w in words if len(w) > 1]
    return (longer or words or [query.lower()])[:MAX_TERMS]


def _text_of(message: Mapping[str, Any]) -> str:
    """The visible text of a message: its string content or its text blocks."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [b.get("text") for b in content if isinstance(b, Mapping) and b.get("type") == "text"]
    return "\n".join(p for p in parts if isinstance(p, str))


def _snippet(text: str, needles: Sequence[str]) -> str:
    """At most MAX_SNIPPET_CHARS of ``text`` around the first needle found."""
    flat = " ".join(text.split())
    lowered = flat.lower()
    at = min((i for n in needles if (i := lowered.find(n)) >= 0), default=0)
    if len(flat) <= MAX_SNIPPET_CHARS:
        return flat
    start = max(0, min(at - MAX_SNIPPET_CHARS // 3, len(flat) - MAX_SNIPPET_CHARS + 2))
    body = flat[start : start + MAX_SNIPPET_CHARS - 2]
    return ("…" if start else "") + body + ("…" if start + len(body) < len(flat) else "")


def _score(text: str, phrase: str, terms: Sequence[str]) -> float:
    lowered = " ".join(text.lower().split())
    found = sum(1 for t in terms if t in lowered)
    if not found:
        return 0.0
    return round(found / len(terms) + (1.0 if phrase in lowered else 0.0), 3)


def _hit(
    ctx: ToolContext, c: Candidate, text: str, score: float, needles: Sequence[str]
) -> dict[str, Any]:
    msg = c.message
    hit: dict[str, Any] = {
        "sessionKey": display_key(ctx.services, c.session_key, ctx.agent_id),
        "messageId": str(msg.get("id") or c.seq),
        "timestamp": msg.get("timestamp"),
        "role": msg.get("role"),
        "snippet": _snippet(redact_text(text), needles),
        "score": score,
    }
    return {k: v for k, v in hit.items() if v is not None}


def _scope(ctx: ToolContext, raw: str | None) -> tuple[list[str], int, bool] | dict[str, Any]:
    """The sessions to scan, messages per session, and whether the scan leaves some out;
    or the refusal when ``raw`` names a session the caller may not see."""
    svc = ctx.services
    if raw is None:
        entries, more = visible_sessions(ctx, SCAN_SESSIONS)
        return [e.key for e in entries], SCAN_MESSAGES, more
    try:
        key = resolve_session_ref(svc, raw, requester_key=ctx.session_key)
    except NotFound as exc:
        return {"status": "error", "error": exc.message}
    verdict = visibility_guard(ctx).check(key, "search")
    if not verdict.allowed:
        return forbidden_result(ctx, raw, verdict)
    return [key], ONE_SESSION_MESSAGES, svc.store.transcripts.length(key) > ONE_SESSION_MESSAGES


def _read_query(args: Mapping[str, Any]) -> str:
    query = read_string(args, "query", required=True) or ""
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidInput(f"query must be at most {MAX_QUERY_CHARS} characters", field="query")
    return query


def sessions_search(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """The tool handler: scan, score, keep the best ``limit`` under 32 KiB."""
    query = _read_query(args)
    limit = read_int(args, "limit", default=DEFAULT_LIMIT, lo=1, hi=MAX_LIMIT) or DEFAULT_LIMIT
    scope = _scope(ctx, read_string(args, "sessionKey"))
    if isinstance(scope, dict):
        return scope
    keys, per_session, more = scope
    terms = _terms(query)
    needles = [t.translate(_ASCII_LOWER) for t in terms]
    phrase = " ".join(query.lower().split())
    store = ctx.services.store.search
    found = store.scan(keys, needles, phrase.translate(_ASCII_LOWER), per_session)
    # The best by weight, newest first among equals, read whole and confirmed.
    found.sort(key=lambda c: (c.weight, c.seq), reverse=True)
    scored = []
    for cand in store.read(found[: limit * _READ_FACTOR]):
        if cand.message.get("role") not in _ROLES:
            continue
        text = _text_of(cand.message)
        if score := _score(text, phrase, terms):
            scored.append((score, int(cand.message.get("timestamp") or 0), cand, text))
    scored.sort(key=lambda s: (s[0], s[1]), reverse=True)
    results: list[dict[str, Any]] = []
    size = 64
    cut = False
    for score, _, cand, text in scored[:limit]:
        hit = _hit(ctx, cand, text, score, terms)
        size += len(orjson.dumps(hit)) + 1
        if size > MAX_RESULT_BYTES - 512:
            cut = True
            break
        results.append(hit)
    _add_session_ids(ctx, results, [c for _, _, c, _ in scored[: len(results)]])
    answer: dict[str, Any] = {"results": results}
    if more or cut:
        answer["truncated"] = True
        answer["warning"] = _warning(more, cut)
    return answer


def _add_session_ids(
    ctx: ToolContext, results: list[dict[str, Any]], cands: Sequence[Candidate]
) -> None:
    """Each hit's sessionId, read in one round trip."""
    entries = ctx.services.store.sessions.get_many(
        list(dict.fromkeys(c.session_key for c in cands))
    )
    ids = {e.key: e.session_id for e in entries if e is not None}
    for hit, cand in zip(results, cands, strict=True):
        if session_id := ids.get(cand.session_key):
            hit["sessionId"] = session_id


def _warning(more: bool, cut: bool) -> str:
    if cut:
        return "Results were cut to keep the answer under 32 KiB; lower limit or refine the query."
    return (
        f"Only the {SCAN_SESSIONS} most recently active visible sessions (their newest "
        f"{SCAN_MESSAGES} messages each), or one session's newest {ONE_SESSION_MESSAGES}, "
        "were searched; pass sessionKey to search one session further back."
    )


SPEC = ToolSpec(
    name="sessions_search",
    description=(
        "Search the text of messages in the sessions you can see (or one session with "
        "sessionKey). Returns hits with sessionKey, messageId, timestamp, role, a redacted "
        "snippet and a score, best first; use sessions_history to read around a hit."
    ),
    parameters={
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_QUERY_CHARS,
                "description": "Words to look for (case-insensitive).",
            },
            "sessionKey": {
                "type": "string",
                "description": "Search only this session (a key, `current`, or a sessionId).",
            },
            "limit": {
                "type": "number",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "description": f"Max hits (default {DEFAULT_LIMIT}, at most {MAX_LIMIT}).",
            },
        },
        "required": ["query"],
    },
    handler=sessions_search,
)
