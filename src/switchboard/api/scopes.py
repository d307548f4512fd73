"""Who a request acts for: the owner, or a scoped token, and what the latter may do.

The auth gate (`auth.AuthGate`) resolves every bearer token into a `Principal` and puts it
in the request's scope; surfaces read it with `principal_of`. The owner token
(SWITCHBOARD_TOKEN) may do anything. A scoped token (`switchboard token create`) acts
only as sessions of its agent (`check_session`), only as its one session when it names
one, and calls only its tools when it names some (`check_tool`; such a token starts no
runs over `/rpc` or the OpenAI routes: `check_may_start_runs`). Anything else is
`ScopeRefused` (403). Inside its scope the token's calls are judged by visibility and send
policy as its agent's session, like any caller acting as that session, and never as the
owner (no `/send on|off`).

Each request a scoped token makes carries an `AuditNote` the surfaces fill in (tool,
session key, tool outcome); the gate writes it to the audit stream once answered.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import HTTPConnection

from switchboard.shared import keys as sk
from switchboard.shared.errors import Forbidden
from switchboard.shared.store.tokens import TokenRecord

PRINCIPAL = "switchboard.principal"  # scope key: the request's Principal
AUDIT_NOTE = "switchboard.audit"  # scope key: the request's AuditNote (scoped tokens only)

# The surfaces a scoped token may use, by path (exact, or a prefix ending in "/"), and
# the name the audit stream gives each; every other path needs the owner token.
SCOPED_SURFACES: tuple[tuple[str, str], ...] = (
    ("/tools/invoke", "tools"),
    ("/rpc", "rpc"),
    ("/mcp", "mcp"),
    ("/a2a/", "a2a"),  # each agent checks the token's agent (api/a2a.py)
    ("/.well-known/agent-card.json", "a2a"),
    ("/v1/responses", "responses"),
    ("/v1/responses/", "responses"),
    ("/v1/files", "files"),
    ("/v1/files/", "files"),
    ("/v1/batches", "batches"),
    ("/v1/batches/", "batches"),
    ("/v1/", "openai"),
)


class ScopeRefused(Forbidden):
    """A scoped token asked for something outside its scope (403)."""

    kind = "forbidden"


@dataclass(frozen=True)
class Principal:
    """The owner (no token id), or a scoped token's agent, session and tools."""

    token_id: str | None = None
    agent_id: str | None = None
    session_key: str | None = None
    tools: frozenset[str] | None = None

    @classmethod
    def of_token(cls, record: TokenRecord) -> Principal:
        """The principal a scoped token's record grants."""
        return cls(record.token_id, record.agent_id, record.session_key, record.tools)

    @property
    def is_owner(self) -> bool:
        """Whether this is the owner token (full power)."""
        return self.token_id is None

    def describe(self) -> str:
        """`token <id> (agent a, session s, tools x, y)`, for refusal messages."""
        parts = [f"agent {self.agent_id}"]
        if self.session_key:
            parts.append(f"session {self.session_key}")
        if self.tools is not None:
            parts.append("tools " + (", ".join(sorted(self.tools)) or "none"))
        return f"token {self.token_id} ({', '.join(parts)})"

    def session_ref(self, ref: str | None) -> str | None:
        """The session reference a call names, else this token's session (if it has one)."""
        return ref if ref and ref.strip() else self.session_key

    def check_agent(self, agent_id: str) -> None:
        """Refuse acting as an agent other than the token's."""
        if not self.is_owner and agent_id != self.agent_id:
            raise ScopeRefused(
                f"{self.describe()} may not act as agent {agent_id!r}", field="agent"
            )

    def sees(self, key: str) -> bool:
        """Whether the session (canonical key) is inside the token's scope."""
        if self.is_owner:
            return True
        if sk.agent_id_of(key) != self.agent_id:
            return False
        return self.session_key is None or key == self.session_key

    def check_session(self, key: str) -> None:
        """Refuse acting as a session (canonical key) outside the token's scope; the
        refusal names no session (a sessionId's key, another agent's) the token cannot see."""
        if self.sees(key):
            return
        if self.session_key is not None:
            raise ScopeRefused(
                f"{self.describe()} may act only as session {self.session_key!r}",
                field="sessionKey",
            )
        raise ScopeRefused(
            f"{self.describe()} may not act as that session: it is not a session of "
            f"agent {self.agent_id!r}",
            field="sessionKey",
        )

    def check_tool(self, name: str) -> None:
        """Refuse a tool outside the token's tool list."""
        if self.tools is not None and name not in self.tools:
            raise ScopeRefused(f"{self.describe()} may not call the tool {name!r}", field="tool")

    def may_call(self, name: str) -> bool:
        """Whether the token may call the tool ``name``."""
        return self.tools is None or name in self.tools

    def check_may_start_runs(self) -> None:
        """Refuse starting runs directly for a token limited to some tools."""
        if self.tools is not None:
            raise ScopeRefused(
                f"{self.describe()} may only call its tools (over /tools/invoke or /mcp); "
                "it may not start runs",
                field="tools",
            )

    def owner_only(self, what: str) -> None:
        """Refuse what only the owner token may do."""
        if not self.is_owner:
            raise ScopeRefused(
                f"{what} needs the owner token (SWITCHBOARD_TOKEN); {self.describe()} "
                "may not use it"
            )


OWNER = Principal()


@dataclass
class AuditNote:
    """What a scoped token's request did, filled in by the surface that served it."""

    surface: str
    tool: str | None = None
    session_key: str | None = None
    outcome: str | None = None  # a tool's own status; else judged from the HTTP status


def principal_of(conn: HTTPConnection) -> Principal:
    """The request's principal (the owner unless the gate found a scoped token)."""
    principal = conn.scope.get(PRINCIPAL)
    return principal if isinstance(principal, Principal) else OWNER


def audit_note(conn: HTTPConnection) -> AuditNote | None:
    """The request's audit note (None for the owner)."""
    note = conn.scope.get(AUDIT_NOTE)
    return note if isinstance(note, AuditNote) else None


def surface_of(path: str) -> str | None:
    """The scoped surface a path belongs to, else None (owner only)."""
    for prefix, name in SCOPED_SURFACES:
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return name
    return None
