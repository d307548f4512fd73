"""A small MCP server for the example config (and the tests), on the official `mcp` SDK.

Tools: `add` (two numbers), `echo` (a text back), `slow` (answers after some seconds),
`fail` (answers a tool error), `whoami` (the server's process id and the call's
idempotency key from its `_meta`). With NOTES_CALL_LOG set, each call appends a JSON line
(tool, arguments, idempotency key, pid, when) to that file.

    python examples/mcp/notes_server.py                      # stdio
    python examples/mcp/notes_server.py --http 8765          # Streamable HTTP on /mcp
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("notes")
KEY = "switchboard/idempotencyKey"


def _log(tool: str, arguments: dict[str, Any], ctx: Context | None = None) -> str | None:
    meta = ctx.request_context.meta if ctx is not None else None
    key = None
    if meta is not None:
        fields = meta if isinstance(meta, dict) else meta.model_dump(by_alias=True)
        key = fields.get(KEY)
    path = os.environ.get("NOTES_CALL_LOG")
    if path:
        line = {
            "tool": tool,
            "arguments": arguments,
            "key": key,
            "pid": os.getpid(),
            "at": time.time(),
        }
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    return key


@server.tool()
def add(a: float, b: float, ctx: Context) -> float:
    """Add two numbers."""
    _log("add", {"a": a, "b": b}, ctx)
    return a + b


@server.tool()
def echo(text: str, ctx: Context) -> str:
    """Answer the text back."""
    _log("echo", {"text": text}, ctx)
    return text


@server.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Answer after `seconds` seconds."""
    _log("slow", {"seconds": seconds}, ctx)
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def fail(message: str, ctx: Context) -> str:
    """Answer a tool error with `message`."""
    _log("fail", {"message": message}, ctx)
    raise ToolError(message)


@server.tool()
def whoami(ctx: Context) -> dict[str, Any]:
    """The server's process id and the call's idempotency key."""
    key = _log("whoami", {}, ctx)
    return {"pid": os.getpid(), "key": key}


def main() -> None:
    """Serve over stdio, or Streamable HTTP with --http PORT."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    port = parser.parse_args().http
    if port is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)


if __name__ == "__main__":
    main()
