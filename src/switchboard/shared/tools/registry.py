"""The names a tool module is written against: ToolSpec, ToolContext, WaitFor, the registry.

They are defined in `switchboard.shared.services` (see its docstring for the handler
contract), below the runtime and the api that use them; tool modules import them here.
"""

from __future__ import annotations

from switchboard.shared.services import (
    Completer,
    Handler,
    Offer,
    ToolContext,
    ToolRegistry,
    ToolSpec,
    WaitFor,
)

__all__ = ["Completer", "Handler", "Offer", "ToolContext", "ToolRegistry", "ToolSpec", "WaitFor"]
