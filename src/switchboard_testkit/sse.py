"""A Server-Sent Events reader for tests of `GET /events`: each event (or comment) parsed
as it arrives, and a bounded wait for the first one a test looks for."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Sse:
    """One parsed Server-Sent Event (or a comment line, with ``event`` = ``comment``)."""

    event: str
    data: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    retry: int | None = None
    comment: str | None = None


def sse_events(resp: httpx.Response) -> Iterator[Sse]:
    """Parse an event stream as it arrives; comments are yielded too."""
    current: dict[str, Any] = {}
    for line in resp.iter_lines():
        if line.startswith(":"):
            yield Sse(event="comment", comment=line[1:].strip())
        elif not line:
            if current:
                data = json.loads(current["data"]) if "data" in current else {}
                retry = int(current["retry"]) if "retry" in current else None
                yield Sse(current.get("event", "message"), data, current.get("id"), retry)
            current = {}
        else:
            name, _, value = line.partition(":")
            current[name] = value[1:] if value.startswith(" ") else value


def until(
    stream: Iterator[Sse], done: Callable[[Sse], bool], limit: int = 200, timeout_s: float = 25
) -> list[Sse]:
    """Events read until (and including) the first one ``done`` accepts.

    The deadline is checked as events (heartbeats included) arrive."""
    deadline = time.monotonic() + timeout_s
    seen: list[Sse] = []
    for ev in stream:
        seen.append(ev)
        if done(ev):
            return seen
        assert len(seen) < limit, f"no matching event in {seen}"
        assert time.monotonic() < deadline, f"no matching event in time: {seen}"
    raise AssertionError(f"stream ended before a matching event: {seen}")
