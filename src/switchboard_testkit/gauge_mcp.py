"""An MCP server (the official `mcp` SDK, Streamable HTTP) that measures the calls in
flight at the server: the tool-limit tests and `switchboard bench -s tools` call it.

`hold` (``ms``, an optional ``id``) answers after ``ms`` milliseconds; the server counts
the calls in flight at once and appends one JSON line per call to ``--log`` (``id``, its
own time ``ownMs``, the calls in flight when it began ``inFlight``, and its start and end
on the host's monotonic clock, ``time.monotonic()``). `peak` answers the most calls in
flight at once and the calls ended so far.

    python -m switchboard_testkit.gauge_mcp --port 8766 --log /tmp/gauge.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer

__all__ = ["read_log", "serve", "start"]


class _Gauge:
    """The calls in flight now, their peak, and the log of ended calls."""

    def __init__(self, log: Path | None) -> None:
        self.in_flight = 0
        self.peak = 0
        self.ended = 0
        self.log = log


def serve(port: int, log: Path | None) -> None:
    """Serve `hold` and `peak` over Streamable HTTP on ``/mcp`` until stopped."""
    server = MCPServer("gauge")
    gauge = _Gauge(log)

    @server.tool()
    async def hold(ms: float, id: str = "") -> str:
        """Answer after `ms` milliseconds."""
        started = time.monotonic()
        gauge.in_flight += 1
        gauge.peak = max(gauge.peak, gauge.in_flight)
        at_start = gauge.in_flight
        try:
            await asyncio.sleep(ms / 1000)
        finally:
            gauge.in_flight -= 1
            gauge.ended += 1
        ended = time.monotonic()
        if gauge.log is not None:
            line = {
                "id": id,
                "ownMs": (ended - started) * 1000,
                "inFlight": at_start,
                "start": started,
                "end": ended,
            }
            with gauge.log.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        return f"held {ms:g} ms"

    @server.tool()
    def peak() -> dict[str, int]:
        """The most calls in flight at once, and the calls ended."""
        return {"peak": gauge.peak, "ended": gauge.ended}

    server.run("streamable-http", host="127.0.0.1", port=port)


def read_log(path: Path) -> list[dict[str, Any]]:
    """The calls the server logged (one dict per ended call)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start(port: int, log: Path | None, timeout_s: float = 20.0) -> subprocess.Popen[bytes]:
    """The server in a child process, once it listens on ``port`` (the caller stops it)."""
    command = [sys.executable, "-m", "switchboard_testkit.gauge_mcp", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, *(["--log", str(log)] if log is not None else [])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the gauge MCP server did not listen on {port}")


def main() -> None:
    """Serve on --port, logging each call to --log."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, default=None)
    args = parser.parse_args()
    serve(args.port, args.log)


if __name__ == "__main__":
    main()
