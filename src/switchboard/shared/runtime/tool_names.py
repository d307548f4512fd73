"""How MCP and Python tools are named for the model, OpenClaw's rules, and their filters.

A tool reaches the model as ``<server>__<tool>``: in the server part every character
outside ``[A-Za-z0-9_-]`` becomes ``-`` and it is cut to 30 characters; the tool part is
cleaned the same way (model APIs accept no other characters); the whole name is cut to
64 characters; a name taken already gets ``-2`` (then ``-3``, ...). A server's
``toolFilter`` (``include``, ``exclude``: globs on the server's own tool names) picks
which of its tools are offered at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

__all__ = ["MAX_NAME", "MAX_SERVER_PART", "SEPARATOR", "assign_names", "passes_filter", "prefix"]

SEPARATOR = "__"
MAX_SERVER_PART = 30
MAX_NAME = 64
_OUTSIDE = re.compile(r"[^A-Za-z0-9_-]")


def prefix(server: str) -> str:
    """The server part of its tools' names."""
    return _OUTSIDE.sub("-", server)[:MAX_SERVER_PART] or "-"


def passes_filter(tool: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether a server's tool is offered: it matches ``include`` (when any) and no
    ``exclude`` glob (case-sensitive, the server's own name)."""
    if include and not any(fnmatchcase(tool, p) for p in include):
        return False
    return not any(fnmatchcase(tool, p) for p in exclude)


def assign_names(servers: Iterable[tuple[str, Sequence[str]]]) -> dict[str, tuple[str, str]]:
    """The model-facing names of the servers' tools, in order: name -> (server, tool)."""
    names: dict[str, tuple[str, str]] = {}
    for server, tools in servers:
        head = prefix(server) + SEPARATOR
        for tool in tools:
            base = (head + _OUTSIDE.sub("-", tool))[:MAX_NAME]
            name, n = base, 1
            while name in names:
                n += 1
                tail = f"-{n}"
                name = base[: MAX_NAME - len(tail)] + tail
            names[name] = (server, tool)
    return names
