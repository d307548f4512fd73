"""The error tree of the domain; the api maps it to status codes in one place.

SwitchboardError
├── InvalidInput   bad arguments (400)
├── NotFound       unknown session, run, tool (404)
├── Forbidden      not allowed by policy (403)
├── Conflict       the state does not allow it (409)
└── Unavailable    a dependency is down; retry later (503)
    └── StoreUnavailable   Redis failed a command (raised by the store's client only)
"""

from __future__ import annotations

from typing import Any


class SwitchboardError(Exception):
    """Base of every error the domain raises on purpose."""

    kind = "error"

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields

    def __str__(self) -> str:
        return self.message


class InvalidInput(SwitchboardError):
    """The caller sent something malformed; nothing was changed."""

    kind = "invalid_request"


class NotFound(SwitchboardError):
    """The named session, run or tool does not exist."""

    kind = "not_found"


class Forbidden(SwitchboardError):
    """Policy does not allow this caller to do this."""

    kind = "forbidden"


class Conflict(SwitchboardError):
    """The current state does not allow the operation."""

    kind = "conflict"


class Unavailable(SwitchboardError):
    """A dependency (Redis, the broker, a model) is unreachable; retry later."""

    kind = "unavailable"

    def __init__(self, message: str, retry_after_s: int = 1, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.retry_after_s = retry_after_s


class BrokerUnavailable(Unavailable):
    """The broker refused a message (down, failing over, or a batch publish whose outcome
    is uncertain): the task queue raises it, from the broker library's error."""

    def __init__(self, detail: str) -> None:
        super().__init__("task queue unavailable, retry shortly", retry_after_s=2, detail=detail)


class StoreUnavailable(Unavailable):
    """Redis failed a command (down, loading, timed out, refused it): the store's client
    raises it, from the redis-py error, for every command and pipeline (`store.client`)."""

    def __init__(self, detail: str) -> None:
        super().__init__("state store unavailable, retry shortly", retry_after_s=2, detail=detail)
