"""Bearer-token authentication (constant-time compare); the token holder is the owner."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request


def configured_token(request: Request) -> str:
    """The token this api accepts."""
    token: str = request.app.state.token
    return token


async def require_token(request: Request) -> None:
    """Dependency: 401 unless `Authorization: Bearer <token>` matches."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    expected = configured_token(request)
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        value.strip().encode(), expected.encode()
    ):
        raise HTTPException(
            status_code=401,
            detail="missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
