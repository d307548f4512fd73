"""Small helpers the tests share: poll for a condition, call a tool over the api."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx


def wait_until(check: Callable[[], Any], what: str, timeout_s: float = 30) -> Any:
    """Poll until ``check()`` is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def invoke(client: httpx.Client, tool: str, **args: Any) -> dict[str, Any]:
    """A tool call acting for the main session; returns the tool result."""
    resp = client.post("/tools/invoke", json={"tool": tool, "args": args})
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result
