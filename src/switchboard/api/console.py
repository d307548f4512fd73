"""The web console: a static page at `/console` that reads over `/rpc` and follows `/events`.

The page, its script, its stylesheet and its icon (``switchboard/api/console/``, in the
wheel, no build step) carry no data and are served without a token; the page asks for the
token once and trades it at ``POST /console/login`` for a console session
(`console_session`: derived from the token, expiring), which it keeps in the browser's
localStorage and sends as its bearer header; the token itself is not kept. Because
``EventSource`` cannot send headers, the login also sets the session as an HttpOnly,
SameSite=Strict cookie (Secure on https) scoped to ``/events``; ``POST /console/logout``
clears it.
"""

from __future__ import annotations

import time
from functools import cache
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import RedirectResponse

from switchboard.api import events
from switchboard.api.auth import allow_public, configured_token, require_token
from switchboard.api.console_session import issue_session, session_expiry_ms
from switchboard.shared.errors import NotFound

CONSOLE_PATH = "/console"
# The files of the page shell and their media types.
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
# Browsers ask for /favicon.ico on their own; it gets the console's SVG icon.
FAVICON_PATH = "/favicon.ico"
# Served without a token: the redirect, the page shell and the icon.
PAGE_PATHS = ("/", CONSOLE_PATH, FAVICON_PATH, *(f"{CONSOLE_PATH}/{name}" for name in ASSETS))
_SECURITY_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; "
        "base-uri 'none'; frame-ancestors 'none'"
    ),
}

router = APIRouter(include_in_schema=False)


@cache
def asset(name: str) -> bytes:
    """One file of the page shell, read once from the package."""
    return (resources.files("switchboard.api") / "console" / name).read_bytes()


@router.get("/")
async def root() -> RedirectResponse:
    """The console is the api's front page."""
    return RedirectResponse(CONSOLE_PATH, status_code=307)


@router.get(CONSOLE_PATH)
async def page() -> Response:
    """The console page."""
    return _asset_response("index.html")


@router.get(FAVICON_PATH)
async def favicon() -> Response:
    """The icon a browser asks for by itself (an SVG, whatever the name says)."""
    return _asset_response("favicon.svg")


@router.get(CONSOLE_PATH + "/{name}")
async def page_asset(name: str) -> Response:
    """The page's script, stylesheet and icon."""
    if name not in ASSETS:
        raise NotFound(f"no console file {name!r}", field="name")
    return _asset_response(name)


@router.post(CONSOLE_PATH + "/login", dependencies=[Depends(require_token)])
async def login(request: Request, response: Response) -> dict[str, Any]:
    """A console session for the token's holder (the same one for a session's holder: it
    is not renewed), also set as the events cookie."""
    token = configured_token(request)
    presented = request.headers.get("authorization", "").partition(" ")[2].strip()
    expires_ms = session_expiry_ms(presented, token)
    session = presented if expires_ms is not None else issue_session(token)
    expires_ms = session_expiry_ms(session, token) or 0
    response.set_cookie(
        events.EVENTS_COOKIE,
        session,
        max_age=max(1, expires_ms // 1000 - int(time.time())),
        path=events.EVENTS_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return {"ok": True, "session": session, "expiresAt": expires_ms}


@router.post(CONSOLE_PATH + "/logout", dependencies=[Depends(require_token)])
async def logout(response: Response) -> dict[str, bool]:
    """Clear the events cookie."""
    response.delete_cookie(events.EVENTS_COOKIE, path=events.EVENTS_PATH)
    return {"ok": True}


def _asset_response(name: str) -> Response:
    return Response(asset(name), media_type=ASSETS[name], headers=_SECURITY_HEADERS)


def install_console(app: FastAPI) -> None:
    """Serve the console and `/events`; the page shell (no data) needs no token.

    Call it after ``install_auth``: the page paths join the gate's public paths, and the
    events credentials middleware must wrap the gate."""
    app.include_router(router)
    app.include_router(events.router)
    # Added last, so it is the outermost middleware: it runs before any auth check.
    app.add_middleware(events.EventsCredentials)
    allow_public(app, *PAGE_PATHS)
