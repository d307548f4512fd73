"""A run's tools as a pydantic-ai toolset, built from the product's `ToolSpec`s.

Each tool is offered to the model with its spec's name, description and JSON schema; its
arguments are validated as a JSON object (pydantic-ai asks the model again when they are
not one). A call runs the spec's handler off the run's event loop (`off_loop`): a handler
is blocking code, and the loop's other runs go on meanwhile. What a handler raises stands
for an outcome:

- `WaitFor`: the call must wait for another run. It is deferred (pydantic-ai's
  `CallDeferred`) with the metadata the run is parked with (`ToolRun.defer`).
- `EndTurn` (raised by `sessions_yield`): the call's return is the exception's result, and
  the run ends once the answer's other calls are executed (`ToolRun.ended`).
- a `SwitchboardError`: the call's return is the error, for the model to read.
- `StoreUnavailable`: the store is away; it ends the run's attempt, to be retried.

The toolset holds no run state (that is the run's `ToolRun`, pydantic-ai's ``deps``): one
serves every run offered the same tools (`toolset_for`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.exceptions import CallDeferred
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from switchboard.shared.errors import StoreUnavailable, SwitchboardError
from switchboard.shared.runtime.off_loop import off_loop
from switchboard.shared.services import ToolContext, ToolSpec, WaitFor

__all__ = [
    "MAX_RETRIES",
    "TURN_NOT_ENDED",
    "DeferralOf",
    "EndTurn",
    "SpecToolset",
    "ToolRun",
    "toolset_for",
]

# pydantic-ai's default: how often the model may retry a call it got wrong.
MAX_RETRIES = 1

# A call's arguments: a JSON object (the handler checks its own fields).
_ARGS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))
# The return of a call that asked to end the turn when another call of its answer waits.
TURN_NOT_ENDED = {
    "status": "error",
    "error": "the turn cannot end while another call of the same answer waits for its result",
}


class EndTurn(Exception):
    """Raised by a tool handler to end the run after this answer's calls.

    ``result`` is the call's tool return; ``session_fields`` are written on the session
    in the step that ends the run; ``reply``, when given, is the run's reply (else what
    the model said with the call); ``paused``: the run waits for its children (it ends
    marked ``yielded``), else it is simply over."""

    def __init__(
        self,
        result: Mapping[str, Any],
        *,
        session_fields: Mapping[str, Any] | None = None,
        reply: str | None = None,
        paused: bool = True,
    ) -> None:
        super().__init__(result.get("status"))
        self.result = dict(result)
        self.session_fields = dict(session_fields or {})
        self.reply = reply
        self.paused = paused


# What a call that must wait leaves for parking: WaitFor → the call's metadata.
DeferralOf = Callable[[WaitFor], dict[str, Any]]


@dataclass
class ToolRun:
    """One run as its tools see it: who acts (``ctx``), how a waiting call is parked
    (``defer``), and the end of the turn a call asked for (the first one, with the ids
    of every call that asked)."""

    ctx: ToolContext
    defer: DeferralOf
    ended: EndTurn | None = None
    ending: set[str] = field(default_factory=set)


class SpecToolset(AbstractToolset[ToolRun]):
    """The product's tools (`ToolSpec`s) as a pydantic-ai toolset."""

    def __init__(self, specs: Sequence[ToolSpec]) -> None:
        self._specs = {s.name: s for s in specs}
        self._tools = {
            s.name: ToolsetTool[ToolRun](
                toolset=self,
                tool_def=ToolDefinition(
                    name=s.name,
                    description=s.description,
                    parameters_json_schema=dict(s.parameters),
                    sequential=True,  # one after another, in the order the model made them
                ),
                max_retries=MAX_RETRIES,
                args_validator=_ARGS,
            )
            for s in specs
        }

    @property
    def id(self) -> str:
        return "switchboard"

    async def get_tools(self, ctx: RunContext[ToolRun]) -> dict[str, ToolsetTool[ToolRun]]:
        return self._tools

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[ToolRun],
        tool: ToolsetTool[ToolRun],
    ) -> Any:
        call = partial(_call, self._specs[name], ctx.deps, tool_args, ctx.tool_call_id or "")
        return await off_loop(call)


def _call(spec: ToolSpec, run: ToolRun, arguments: dict[str, Any], call_id: str) -> Any:
    """A call's return: the handler's result, or the outcome its exception stands for."""
    try:
        return spec.handler(run.ctx, arguments)
    except WaitFor as wait:
        raise CallDeferred(metadata=run.defer(wait)) from None
    except EndTurn as end:
        run.ended = run.ended or end
        run.ending.add(call_id)
        return end.result
    except StoreUnavailable:
        raise  # the store is away: retried, not an outcome
    except SwitchboardError as exc:
        return {"status": "error", "tool": spec.name, "error": exc.message}


# The toolsets of the tool sets offered lately, by the identity of their specs: a
# worker's are few (one per agent configuration), and the registry's specs live as long
# as the process.
_TOOLSETS: OrderedDict[tuple[int, ...], tuple[tuple[ToolSpec, ...], SpecToolset]] = OrderedDict()
_TOOLSETS_SIZE = 64
_toolsets_lock = threading.Lock()


def toolset_for(specs: Sequence[ToolSpec]) -> SpecToolset:
    """The toolset of these tools, built once per tool set."""
    key = tuple(id(s) for s in specs)
    with _toolsets_lock:
        hit = _TOOLSETS.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], specs, strict=True)):
            _TOOLSETS.move_to_end(key)
            return hit[1]
    toolset = SpecToolset(specs)
    with _toolsets_lock:
        _TOOLSETS[key] = (tuple(specs), toolset)  # kept with it: their ids stay theirs
        while len(_TOOLSETS) > _TOOLSETS_SIZE:
            _TOOLSETS.popitem(last=False)
    return toolset
