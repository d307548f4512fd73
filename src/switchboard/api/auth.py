"""Bearer-token authentication of every route but the public ones, with a lockout.

The token holder is the owner. ``AuthGate`` (ASGI middleware) checks each HTTP and
WebSocket request before routing, so every router or mounted app (MCP, `/metrics`,
`/events`, the console's data endpoints) is covered without opting in. Public are only
``PUBLIC_PATHS`` and the exact paths given to ``allow_public`` — meant for a static page
shell that carries no data and asks the user for the token; data never is public.

Failed checks are counted per client IP in Redis (a fixed window, so the count holds across
api processes): after ``auth_max_failures`` failures within ``auth_failure_window_s`` that
IP is answered 429 with ``Retry-After`` until the window ends, even with the right token,
so a locked-out client cannot go on testing guesses. A success resets no counter; public
paths are neither checked nor locked. A client that just authenticated on this api is not
looked up again for a second (one read a second for a busy client, not one a request);
any failure ends that at once, so every guess is checked against the shared count.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Iterable

from fastapi import FastAPI, HTTPException, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from switchboard.api.errors import error_response, openai_error_response
from switchboard.shared.config import Settings
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.aio import AsyncStore
from switchboard.shared.store.keyspace import Keyspace

log = logging.getLogger("switchboard.api")

PUBLIC_PATHS = frozenset({"/healthz"})
INVALID_TOKEN = "missing or invalid bearer token"
OPENAI_PATH_PREFIX = "/v1/"  # the OpenAI-compatible routes
_AUTHENTICATED = "switchboard.authenticated"  # scope flag set by the gate
# After a request with the right token, its client's lockout is not read again this long.
CLEARED_FOR_S = 1.0
_CLEARED_MAX = 10_000  # client addresses remembered (then forgotten all at once)


def token_matches(authorization: str, expected: str) -> bool:
    """Whether an Authorization header value is `Bearer <expected>` (constant-time)."""
    scheme, _, value = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode(), expected.encode()
    )


def configured_token(request: Request) -> str:
    """The token this api accepts."""
    token: str = request.app.state.token
    return token


async def require_token(request: Request) -> None:
    """Dependency: 401 unless `Authorization: Bearer <token>` matches (the gate's twin)."""
    if request.scope.get(_AUTHENTICATED):
        return
    if not token_matches(request.headers.get("authorization", ""), configured_token(request)):
        raise HTTPException(
            status_code=401, detail=INVALID_TOKEN, headers={"WWW-Authenticate": "Bearer"}
        )


def install_auth(app: FastAPI, settings: Settings, token: str) -> None:
    """Put the gate in front of every route of ``app``."""
    app.state.public_paths = set(PUBLIC_PATHS)
    app.add_middleware(
        AuthGate,
        token=token,
        public_paths=app.state.public_paths,
        redis_url=settings.redis_url,
        keyspace=Keyspace(settings.key_prefix),
        max_failures=settings.auth_max_failures,
        window_s=settings.auth_failure_window_s,
    )


def allow_public(app: FastAPI, *paths: str) -> None:
    """Serve these exact paths without a token (a page shell with no data in it)."""
    app.state.public_paths.update(paths)


class AuthGate:
    """ASGI middleware: 401 without the token, 429 once a client IP is locked out."""

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
        # Client address -> until when its lockout need not be read (see `_clear`).
        self._cleared: dict[str, float] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing_on_shutdown(send))
            return
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.public_paths:
            await self.app(scope, receive, send)
            return
        client = _client_ip(scope)
        now = time.monotonic()
        cleared = self._cleared.get(client, 0.0) > now
        retry_s = None if cleared else await self._locked_for(client)
        if retry_s is None:
            if token_matches(_header(scope, b"authorization"), self.token):
                self._clear(client, now)
                scope[_AUTHENTICATED] = True
                await self.app(scope, receive, send)
                return
            self._cleared.pop(client, None)
            retry_s = await self._record_failure(client)
        await _refuse(scope, receive, send, retry_s)

    def _clear(self, client: str, now: float) -> None:
        """Spare ``client``'s next lockout checks for `CLEARED_FOR_S` after it authenticated.

        Only a request with the right token clears a client, and any failure from it
        un-clears it at once, so a guess is always checked against the shared count: a
        client busy with good requests costs one lockout read a second, not one each."""
        if len(self._cleared) >= _CLEARED_MAX:
            self._cleared.clear()
        self._cleared[client] = now + CLEARED_FOR_S

    def _client(self) -> AsyncStore | None:
        if self._store is None and self.redis_url:
            self._store = AsyncStore.from_url(self.redis_url, self.ks, socket_timeout=5)
        return self._store

    async def _locked_for(self, client: str) -> int | None:
        """Seconds left of the client's lockout, or None when it may try."""
        store = self._client()
        if store is None:
            return None
        try:
            ttl = await store.locked_ttl(client, self.max_failures)
        except StoreUnavailable as exc:  # the token check still applies
            # DEBUG: the request's own store call reports the outage (one WARNING line).
            log.debug("auth lockout check skipped, redis unavailable: %s", exc.__cause__)
            return None
        return None if ttl is None else _retry_after(ttl, self.window_s)

    async def _record_failure(self, client: str) -> int | None:
        """Count one failure; the lockout's Retry-After once past the limit (a race)."""
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
