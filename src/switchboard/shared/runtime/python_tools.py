"""Python tools from installed packages: the entry-point group ``switchboard.tools``.

A package registers, under the group, an object the worker loads once per process:

- a pydantic-ai toolset (`AbstractToolset`, e.g. a `FunctionToolset`), or
- a plain function (its name, docstring and signature make the tool), or
- a list of functions.

The entry point's name is the server part of the tools' names (``<entry>__<tool>``, the
MCP naming rules), and the policy (`tools.allow|deny`, per agent, sub-agents) filters them
like any tool. A function gets the tool's arguments; one whose first parameter is a
`RunContext` gets the run's too (its ``deps`` is the run's `ToolRun`). An entry point that
cannot be loaded is logged and skipped: the worker starts without its tools.

    [project.entry-points."switchboard.tools"]
    units = "switchboard_units:toolset"
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from pydantic_ai.toolsets import AbstractToolset, FunctionToolset

__all__ = ["ENTRY_POINT_GROUP", "PythonTools", "load_python_tools"]

ENTRY_POINT_GROUP = "switchboard.tools"

log = logging.getLogger("switchboard.tools")


@dataclass(frozen=True)
class PythonTools:
    """One entry point's tools: its name (the tools' server part) and its toolset."""

    name: str
    toolset: AbstractToolset[Any]


def load_python_tools(group: str = ENTRY_POINT_GROUP) -> list[PythonTools]:
    """The tool sets the installed packages register under ``group``, by entry-point name."""
    loaded: list[PythonTools] = []
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        try:
            toolset = as_toolset(ep.load())
        except Exception as exc:
            log.warning("tool entry point %s (%s) not loaded: %s", ep.name, ep.value, exc)
            continue
        loaded.append(PythonTools(ep.name, toolset))
    return loaded


def as_toolset(obj: object) -> AbstractToolset[Any]:
    """A toolset of what an entry point holds (a toolset, a function, or functions)."""
    if isinstance(obj, AbstractToolset):
        return obj
    if callable(obj):
        return FunctionToolset([obj])
    if isinstance(obj, Iterable) and not isinstance(obj, str | bytes):
        functions: list[Callable[..., Any]] = []
        for item in obj:
            if not callable(item):
                raise TypeError(f"not a function: {item!r}")
            functions.append(item)
        return FunctionToolset(functions)
    raise TypeError(f"not a toolset, function or list of functions: {obj!r}")
