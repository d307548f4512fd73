"""Console sessions: an expiring credential derived from the owner token, never the token.

`POST /console/login` (with the owner token) answers a session credential,
``sbs_<expiry ms>_<mac>``: the MAC is an HMAC-SHA256 of the expiry keyed with the owner
token, so the api checks it with no state (every api process, no Redis read) and a new
token ends every session at once. Until it expires the credential acts as the owner on
every route; the console keeps it (not the token) and the events cookie holds it (HttpOnly,
SameSite=Strict, Secure on https). It cannot be renewed with itself: a later login with
it answers the same credential.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

SESSION_PREFIX = "sbs_"
# How long a console session lasts.
SESSION_TTL_S = 12 * 3600
_CONTEXT = b"switchboard console session "


def _mac(token: str, expires_ms: int) -> str:
    digest = hmac.new(token.encode(), _CONTEXT + str(expires_ms).encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def issue_session(token: str, ttl_s: int = SESSION_TTL_S, now_s: float | None = None) -> str:
    """A new session credential for the holder of ``token``, valid ``ttl_s`` seconds."""
    expires_ms = int(((time.time() if now_s is None else now_s) + ttl_s) * 1000)
    return f"{SESSION_PREFIX}{expires_ms}_{_mac(token, expires_ms)}"


def session_expiry_ms(value: str, token: str, now_s: float | None = None) -> int | None:
    """When a session credential expires (ms), or None unless it is one ``token`` made
    and still live (constant-time check)."""
    if not value.startswith(SESSION_PREFIX):
        return None
    expiry, _, mac = value.removeprefix(SESSION_PREFIX).partition("_")
    if not expiry.isdigit() or len(expiry) > 15:
        return None
    expires_ms = int(expiry)
    if not hmac.compare_digest(mac.encode(), _mac(token, expires_ms).encode()):
        return None
    now_ms = (time.time() if now_s is None else now_s) * 1000
    return expires_ms if expires_ms > now_ms else None
