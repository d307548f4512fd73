"""`switchboard token create|list|revoke` and `switchboard audit`: scoped api tokens.

These commands talk to Redis directly (the running `up`'s, else SWITCHBOARD_REDIS_URL),
not to the api: a token is a record in the store that every api looks up per request.
`token create` prints the token once (only its sha256 is kept); `token revoke` ends it on
every api at the next request; `audit` reads what scoped tokens did.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Column, Table

from switchboard.cli.common import (
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    ConfigOpt,
    _fail,
    _settings,
    _with_stack_redis,
    app,
    console,
    err,
)
from switchboard.shared import keys as sk
from switchboard.shared.config import SwitchboardConfig, get_config
from switchboard.shared.store.audit import AuditStore
from switchboard.shared.store.client import connect_plain
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.tokens import TokenRecord, TokenStore

token_app = typer.Typer(
    help="Scoped api tokens: create (printed once), list, revoke.", no_args_is_help=True
)
app.add_typer(token_app, name="token")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")]
_DURATION = re.compile(r"(\d+)\s*([smhdw]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> int:
    """Seconds in a duration like `90s`, `30m`, `12h`, `30d`, `2w` (a bare number: seconds)."""
    match = _DURATION.fullmatch(text.strip().lower())
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)] if match else 0
    if seconds <= 0:
        _fail("usage", f"--ttl {text!r}: expected a positive duration like 90s, 30m, 12h, 30d", 2)
    return seconds


def _stores(config: Any) -> tuple[TokenStore, AuditStore, SwitchboardConfig]:
    """The token and audit stores on the stack's Redis, and the config."""
    settings = _with_stack_redis(_settings(config))
    if not settings.redis_url:
        _fail(
            "unavailable",
            "no Redis: set SWITCHBOARD_REDIS_URL or start the stack with `switchboard up`",
            EXIT_UNAVAILABLE,
        )
    client = connect_plain(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    ks = Keyspace(settings.key_prefix, settings.groups)
    return TokenStore(client, ks), AuditStore(client, ks), get_config(settings.config)


def _scope(
    cfg: SwitchboardConfig, agent: str, session: str | None, tools: str | None
) -> tuple[str, str | None, list[str] | None]:
    """The agent id, canonical session key and tool names, checked (a bad one: exit 2)."""
    agent_id = agent.strip().lower()
    if agent_id not in cfg.agent_ids():
        known = ", ".join(cfg.agent_ids())
        _fail("usage", f"--agent {agent!r} is not a configured agent (known: {known})", EXIT_USAGE)
    key = None
    if session is not None:
        options = {"main_key": cfg.session.main_key, "scope": cfg.session.scope}
        key = sk.canonical_key(session, agent_id=agent_id, **options)
        if sk.agent_id_of(key) != agent_id:
            _fail("usage", f"--session {session!r} is not a session of agent {agent_id}", 2)
    names = None
    if tools is not None:
        # Imported here: the tool catalog pulls in the model stack, which every other
        # command (and a refused `up`) would otherwise wait for at start.
        from switchboard.shared.tools.catalog import ALL_TOOLS

        names = sorted({t.strip() for t in tools.split(",") if t.strip()})
        known_tools = {spec.name for spec in ALL_TOOLS}
        unknown = [t for t in names if t not in known_tools]
        if unknown or not names:
            _fail(
                "usage",
                f"--tools: unknown {unknown or tools!r} (known: {', '.join(sorted(known_tools))})",
                EXIT_USAGE,
            )
    return agent_id, key, names


@token_app.command("create")
def token_create(
    agent: Annotated[str, typer.Option("--agent", help="The agent the token acts for.")],
    session: Annotated[
        str | None, typer.Option("--session", help="Only this session of the agent.")
    ] = None,
    tools: Annotated[
        str | None, typer.Option("--tools", help="Only these tools (comma-separated).")
    ] = None,
    ttl: Annotated[
        str | None, typer.Option("--ttl", help="Lifetime: 90s, 30m, 12h, 30d, 2w (default: none).")
    ] = None,
    label: Annotated[str | None, typer.Option("--label", help="A note to tell it by.")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a scoped token and print it once (only its hash is stored)."""
    ttl_s = parse_duration(ttl) if ttl is not None else None
    tokens, _, cfg = _stores(config)
    agent_id, key, names = _scope(cfg, agent, session, tools)
    issued = tokens.create(agent_id, session_key=key, tools=names, label=label, ttl_s=ttl_s)
    if as_json:
        _print_json({"token": issued.token, **_row(issued.record)})
        return
    sys.stdout.write(issued.token + "\n")
    err.print(
        f"[dim]token {issued.record.token_id}: {escape(_describe(issued.record))}; "
        "shown once, it cannot be read again[/]"
    )


@token_app.command("list")
def token_list(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """The live tokens: id, scope, label, created, last used (never the secret)."""
    tokens, _, _ = _stores(config)
    records = tokens.list()
    if as_json:
        _print_json([_row(r) for r in records])
        return
    table = Table("scope", "label", "created", "last used", "expires")
    table.columns.insert(0, Column("id", no_wrap=True, min_width=16))  # copied into `revoke`
    for r in records:
        cells = (
            r.token_id,
            _describe(r),
            r.label or "",
            _when(r.created_at_ms),
            _when(r.last_used_at_ms) or "never",
            _when(r.expires_at_ms) or "never",
        )
        table.add_row(*(escape(c) for c in cells))
    console.print(table)
    console.print(f"{len(records)} token(s)", markup=False)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(metavar="ID", help="The token id (`token list`).")],
    config: ConfigOpt = None,
) -> None:
    """End a token at once, on every api (exit 1 when there is no such token)."""
    tokens, _, _ = _stores(config)
    if not tokens.revoke(token_id.strip()):
        _fail("not found", f"no token {token_id}", EXIT_REFUSED)
    console.print(f"revoked {escape(token_id.strip())}")


@app.command("audit")
def audit(
    token: Annotated[str | None, typer.Option("--token", help="Only this token id.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="How many entries.", min=1)] = 50,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What scoped tokens did: the newest calls, oldest first."""
    _, audit_store, _ = _stores(config)
    entries = audit_store.recent(limit, token_id=token)
    if as_json:
        _print_json([e.as_json() for e in entries])
        return
    table = Table("time", "surface", "tool", "session", "outcome", "status")
    table.columns.insert(1, Column("token", no_wrap=True, min_width=16))
    for e in entries:
        cells = (
            _when(e.at_ms),
            e.token_id,
            e.surface,
            e.tool or "",
            e.session_key or "",
            e.outcome,
            str(e.status),
        )
        table.add_row(*(escape(c) for c in cells))
    console.print(table)
    console.print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}", markup=False)


def _describe(r: TokenRecord) -> str:
    parts = [f"agent {r.agent_id}"]
    if r.session_key:
        parts.append(f"session {r.session_key}")
    if r.tools is not None:
        parts.append("tools " + ",".join(sorted(r.tools)))
    return ", ".join(parts)


def _row(r: TokenRecord) -> dict[str, Any]:
    return {
        "id": r.token_id,
        "agentId": r.agent_id,
        "sessionKey": r.session_key,
        "tools": sorted(r.tools) if r.tools is not None else None,
        "label": r.label,
        "createdAt": r.created_at_ms,
        "lastUsedAt": r.last_used_at_ms,
        "expiresAt": r.expires_at_ms,
    }


def _when(at_ms: int | None) -> str:
    if not at_ms:
        return ""
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _print_json(value: Any) -> None:
    """JSON on stdout, unstyled and unwrapped."""
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
