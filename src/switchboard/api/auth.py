"""Bearer-token authentication of every route but the public ones, with a lockout.

The token holder is the owner; so is, until it expires, the holder of a console session
derived from the token (`console_session`: the console and the events cookie use it,
never the token itself). ``AuthGate`` (ASGI middleware) checks each HTTP and
WebSocket request before routing, so every router or mounted app (MCP, `/metrics`,
`/events`, the console's data endpoints) is covered without opting in. Public are only
``PUBLIC_PATHS`` and the exact paths given to ``allow_public`` — meant for a static page
shell that carries no data and asks the user for the token; data never is public.

The lockout refuses guesses only. A request that presents no credential (no
``Authorization`` header, or an empty one: a CORS preflight, a page's ``no-cors`` fetch)
is answered 401 and counted nowhere. A presented, wrong credential is counted per client IP
in Redis (a fixed window, so the count holds across api processes): past
``auth_max_failures`` failures within ``auth_failure_window_s`` that IP's wrong credentials
are answered 429 with ``Retry-After`` until the window ends. A right token is never
refused by the lockout, so nobody can lock the owner out (and what keeps a guesser out is
the token's length: `up` makes 24 random bytes, scoped tokens hold 32). The client IP is
the connection's peer; ``X-Forwarded-For`` is read (by uvicorn) only from the peers named
in ``SWITCHBOARD_TRUSTED_PROXIES`` (`proxy_options`), so a forged header neither rotates
an attacker's address nor charges another's.

Besides the owner token, the gate takes scoped tokens (``sbt_…``, `switchboard token
create`): each is looked up in Redis on every request (one HGETALL, no cache, so a revoke
holds on every api at the next request), becomes a `scopes.Principal` in the request's
scope, and may reach only the surfaces `scopes.SCOPED_SURFACES` names (others: 403). Once
answered, its call is written to the audit stream with what the surface noted.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from typing import Any

import anyio
from fastapi import FastAPI, HTTPException, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from switchboard.api.console_session import session_expiry_ms
from switchboard.api.errors import error_response, openai_error_response
from switchboard.api.scopes import (
    AUDIT_NOTE,
    PRINCIPAL,
    AuditNote,
    Principal,
    surface_of,
)
from switchboard.shared.config import Settings
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.aio import AsyncStore
from switchboard.shared.store.audit import AsyncAuditStore, AuditEntry
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.runs import now_ms
from switchboard.shared.store.tokens import TOKEN_PREFIX, AsyncTokenStore

log = logging.getLogger("switchboard.api")

PUBLIC_PATHS = frozenset({"/healthz"})
INVALID_TOKEN = "missing or invalid bearer token"
OPENAI_PATH_PREFIX = "/v1/"  # the OpenAI-compatible routes
_AUTHENTICATED = "switchboard.authenticated"  # scope flag set by the gate


def token_matches(authorization: str, expected: str) -> bool:
    """Whether an Authorization header value is `Bearer <expected>` (constant-time)."""
    scheme, _, value = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode(), expected.encode()
    )


def bearer_session(authorization: str, token: str) -> bool:
    """Whether an Authorization header value is `Bearer <a live console session>` made
    from ``token`` (`console_session`: the owner's, for a while)."""
    scheme, _, value = authorization.partition(" ")
    return scheme.lower() == "bearer" and session_expiry_ms(value.strip(), token) is not None


def presented(authorization: str) -> bool:
    """Whether an Authorization header value presents a credential at all (a guess)."""
    scheme, _, value = authorization.strip().partition(" ")
    return bool(value.strip()) or (bool(scheme) and scheme.lower() != "bearer")


def configured_token(request: Request) -> str:
    """The token this api accepts."""
    token: str = request.app.state.token
    return token


async def require_token(request: Request) -> None:
    """Dependency: 401 unless `Authorization: Bearer <token>` matches (the gate's twin)."""
    if request.scope.get(_AUTHENTICATED):
        return
    authorization, token = request.headers.get("authorization", ""), configured_token(request)
    if not token_matches(authorization, token) and not bearer_session(authorization, token):
        raise HTTPException(
            status_code=401, detail=INVALID_TOKEN, headers={"WWW-Authenticate": "Bearer"}
        )


def proxy_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's proxy-header options: `X-Forwarded-For` believed only from the peers in
    ``SWITCHBOARD_TRUSTED_PROXIES``, and off with none (uvicorn otherwise trusts loopback)."""
    trusted = settings.trusted_proxies
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted or None}


def install_auth(app: FastAPI, settings: Settings, token: str) -> None:
    """Put the gate in front of every route of ``app``."""
    app.state.public_paths = set(PUBLIC_PATHS)
    app.add_middleware(
        AuthGate,
        token=token,
        public_paths=app.state.public_paths,
        redis_url=settings.redis_url,
        keyspace=Keyspace(settings.key_prefix, settings.groups),
        max_failures=settings.auth_max_failures,
        window_s=settings.auth_failure_window_s,
    )


def allow_public(app: FastAPI, *paths: str) -> None:
    """Serve these exact paths without a token (a page shell with no data in it)."""
    app.state.public_paths.update(paths)


class AuthGate:
    """ASGI middleware: 401 without the token; 429 to a wrong one once its IP is locked out."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        public_paths: Iterable[str],
        redis_url: str | None,
        keyspace: Keyspace,
        max_failures: int,
        window_s: int,
    ) -> None:
        self.app = app
        self.token = token
        self.public_paths = public_paths
        self.redis_url = redis_url
        self.ks = keyspace
        self.max_failures = max_failures
        self.window_s = window_s
        self._store: AsyncStore | None = None
        self._tokens: AsyncTokenStore | None = None
        self._audit: AsyncAuditStore | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing_on_shutdown(send))
            return
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.public_paths:
            await self.app(scope, receive, send)
            return
        authorization = _header(scope, b"authorization")
        if not presented(authorization):  # costs nothing: no guess was made
            await _refuse(scope, receive, send, None)
            return
        if token_matches(authorization, self.token) or bearer_session(authorization, self.token):
            scope[_AUTHENTICATED] = True
            await self.app(scope, receive, send)
            return
        try:
            principal = await self._scoped_principal(authorization)
        except StoreUnavailable as exc:
            log.warning("scoped token not checked, redis unavailable: %s", exc.__cause__)
            await _unavailable(scope, receive, send)
            return
        if principal is not None:
            scope[_AUTHENTICATED] = True
            await self._serve_scoped(scope, receive, send, principal)
            return
        retry_s = await self._record_failure(_client_ip(scope))
        await _refuse(scope, receive, send, retry_s)

    async def _scoped_principal(self, authorization: str) -> Principal | None:
        """The principal of a live scoped token in the header, else None (looked up in
        Redis on every request: a revoke anywhere holds here at the next one)."""
        scheme, _, value = authorization.partition(" ")
        value = value.strip()
        if scheme.lower() != "bearer" or not value.startswith(TOKEN_PREFIX):
            return None
        tokens = self._token_store()
        record = await tokens.verify(value) if tokens is not None else None
        return Principal.of_token(record) if record is not None else None

    async def _serve_scoped(
        self, scope: Scope, receive: Receive, send: Send, principal: Principal
    ) -> None:
        """Serve a scoped token's request on the surfaces it may use (403 elsewhere),
        writing its audit entry as the answer ends."""
        surface = surface_of(scope["path"]) if scope["type"] == "http" else None
        note = AuditNote(surface or scope["path"])
        if surface is None:
            await self._record(principal, note, 403)
            await _refuse_scoped(scope, receive, send, principal)
            return
        scope[PRINCIPAL] = principal
        scope[AUDIT_NOTE] = note
        status, recorded = 500, False  # 500 unless the app answers

        async def recording_send(message: Message) -> None:
            # The entry is written before the answer's last byte: a client that has its
            # answer finds its call in the audit.
            nonlocal status, recorded
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                recorded = True
                await self._record(principal, note, status)
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            if not recorded:  # the app failed, or the client left before the end
                await self._record(principal, note, status)

    async def _record(self, principal: Principal, note: AuditNote, status: int) -> None:
        """Append the call to the audit stream (best effort: a failure is logged).

        Shielded: a streamed answer's sender is cancelled as the stream ends (sse-starlette
        does so), which must not cancel the write halfway."""
        with anyio.CancelScope(shield=True):
            await self._write_entry(principal, note, status)

    async def _write_entry(self, principal: Principal, note: AuditNote, status: int) -> None:
        audit = self._audit_store()
        if audit is None or principal.token_id is None:
            return
        outcome = note.outcome or _outcome_of(status)
        entry = AuditEntry(
            token_id=principal.token_id,
            surface=note.surface,
            outcome=outcome,
            status=status,
            at_ms=now_ms(),
            tool=note.tool,
            session_key=note.session_key,
        )
        try:
            await audit.record_use(entry)
        except StoreUnavailable as exc:
            log.warning("audit entry not written, redis unavailable: %s", exc.__cause__)

    def _token_store(self) -> AsyncTokenStore | None:
        store = self._client()
        if self._tokens is None and store is not None:
            self._tokens = AsyncTokenStore(store.client, self.ks)
        return self._tokens

    def _audit_store(self) -> AsyncAuditStore | None:
        store = self._client()
        if self._audit is None and store is not None:
            self._audit = AsyncAuditStore(store.client, self.ks)
        return self._audit

    def _client(self) -> AsyncStore | None:
        if self._store is None and self.redis_url:
            self._store = AsyncStore.from_url(self.redis_url, self.ks, socket_timeout=5)
        return self._store

    async def _record_failure(self, client: str) -> int | None:
        """Count one failure; the lockout's Retry-After once past the limit."""
        store = self._client()
        if store is None:
            return None
        try:
            failures = await store.count_failure(client, self.window_s)
        except StoreUnavailable as exc:
            log.warning("auth failure not counted, redis unavailable: %s", exc.__cause__)
            return None
        count, ttl = failures.count, failures.ttl_s
        if count == self.max_failures:
            log.warning("auth lockout of %s for %ss after %s failures", client, ttl, count)
        # Failures up to the limit are told 401; requests after it are locked out.
        return _retry_after(ttl, self.window_s) if count > self.max_failures else None

    def _closing_on_shutdown(self, send: Send) -> Send:
        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete" and self._store is not None:
                await self._store.aclose()
                self._store = None
                self._tokens = self._audit = None
            await send(message)

        return wrapped


def _retry_after(ttl: int, window_s: int) -> int:
    """Seconds until a window ends (a key without TTL counts as a full window)."""
    return int(ttl) if int(ttl) > 0 else window_s


def _client_ip(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


async def _refuse(scope: Scope, receive: Receive, send: Send, retry_s: int | None) -> None:
    """Answer 429 (locked out) or 401; a WebSocket is closed with a policy violation."""
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008, "reason": INVALID_TOKEN})
        return
    if retry_s is not None:
        status, kind = 429, "rate_limited"
        message = f"too many failed authentications from this client; retry in {retry_s}s"
        headers = {"Retry-After": str(retry_s)}
    else:
        status, kind, message = 401, "unauthorized", INVALID_TOKEN
        headers = {"WWW-Authenticate": "Bearer"}
    if scope["path"].startswith(OPENAI_PATH_PREFIX):  # OpenAI clients read OpenAI's shape
        code = "invalid_api_key" if status == 401 else kind
        response = openai_error_response(status, message, code=code, headers=headers)
    else:
        response = error_response(status, kind, message, headers)
    await response(scope, receive, send)


def _outcome_of(status: int) -> str:
    """An audited call's outcome from its HTTP status."""
    if status < 400:
        return "ok"
    return "refused" if status == 403 else "error"


async def _refuse_scoped(scope: Scope, receive: Receive, send: Send, principal: Principal) -> None:
    """403 for a scoped token on an owner-only path (a WebSocket: closed)."""
    message = (
        f"{scope['path']} needs the owner token (SWITCHBOARD_TOKEN); "
        f"{principal.describe()} may not use it"
    )
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    if scope["path"].startswith(OPENAI_PATH_PREFIX):
        response = openai_error_response(403, message, kind="permission_error", code="forbidden")
    else:
        response = error_response(403, "forbidden", message)
    await response(scope, receive, send)


async def _unavailable(scope: Scope, receive: Receive, send: Send) -> None:
    """503: a scoped token cannot be checked while Redis is down."""
    message = "state store unavailable, retry shortly"
    headers = {"Retry-After": "1"}
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.close", "code": 1013, "reason": message})
        return
    if scope["path"].startswith(OPENAI_PATH_PREFIX):
        response = openai_error_response(
            503, message, kind="server_error", code="unavailable", headers=headers
        )
    else:
        response = error_response(503, "unavailable", message, headers)
    await response(scope, receive, send)
