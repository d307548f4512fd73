"""The services a request or task works with, wired once by the composition root.

The tool registry's types live here too (``switchboard.shared.tools.registry`` re-exports
them for tool modules): the runtime offers tools to a run and the api invokes them, and
neither may import the tools package, which sits above both.

A tool handler is a plain function of (context, arguments) returning the tool's JSON. A
handler that must wait for another run raises ``WaitFor``: inside an agent run the run is
parked (no worker slot is held) and resumed when the target ends or the deadline passes;
over HTTP the api waits asynchronously. Either way ``ToolSpec.complete`` turns the target
run's outcome into the tool result, so both paths answer the same.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from switchboard.shared.config import Settings, SwitchboardConfig
from switchboard.shared.metrics import Metrics
from switchboard.shared.queue import InlineStep, TaskQueue
from switchboard.shared.store import Store

if TYPE_CHECKING:
    from switchboard.shared.store.runs import Claim, RunRecord

RunHook = Callable[["Services", "RunRecord"], None]


class RunWatch(Protocol):
    """Told of each run's life where it is executed or ended (a worker's task events
    for Flower, `workers.task_events`); it must not block: it runs on the run loop."""

    def started(self, run: RunRecord, claim: Claim) -> None:
        """A worker claimed the run and starts (or, after a lost worker, restarts) it."""

    def ended(self, status: str, run: RunRecord | None) -> None:
        """The run ended with ``status`` (``run``: as its end step stored it)."""


class Unwatched:
    """No one watches (the api, the CLI): a `RunWatch` that does nothing."""

    def started(self, run: RunRecord, claim: Claim) -> None:
        """Nothing."""

    def ended(self, status: str, run: RunRecord | None) -> None:
        """Nothing."""


@dataclass(frozen=True)
class ToolContext:
    """Who is acting: decided by the server from the run's identity, never from arguments."""

    services: Services
    session_key: str
    agent_id: str
    run_id: str | None = None
    channel: str | None = None
    sandboxed: bool = False
    owner: bool = False
    spawn_depth: int = 0


class WaitFor(Exception):
    """Raised by a handler that must wait for a run before it can answer."""

    def __init__(
        self,
        target_run_id: str,
        timeout_s: float,
        context: Mapping[str, Any],
        *,
        also: Sequence[str] = (),
        acted: bool = False,
    ) -> None:
        super().__init__(target_run_id)
        self.target_run_id = target_run_id
        self.timeout_s = timeout_s
        self.context = dict(context)
        # More runs whose end may answer the call: it is answered once any one of them
        # ends (and the tool's `ready`, if it has one, agrees), or at the timeout.
        self.also = tuple(also)
        # The handler acted before the wait (it started the run): a store outage that
        # outlasts the wait answers as a wait that saw no end, never as an error a client
        # would retry (and so act twice).
        self.acted = acted

    def remaining(self, timeout_s: float) -> WaitFor:
        """The same wait with ``timeout_s`` left of it."""
        return WaitFor(
            self.target_run_id, timeout_s, self.context, also=self.also, acted=self.acted
        )

    @property
    def target_run_ids(self) -> tuple[str, ...]:
        """Every run whose end may answer the call."""
        return (self.target_run_id, *self.also)


Handler = Callable[[ToolContext, dict[str, Any]], dict[str, Any]]
Completer = Callable[[ToolContext, Mapping[str, Any], "RunRecord | None"], dict[str, Any]]
# Whether a waiting call can be answered now (before its deadline), from its context.
Readiness = Callable[[ToolContext, Mapping[str, Any]], bool]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, model-facing description and JSON schema, and its handler."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: Handler
    complete: Completer | None = None
    session_tool: bool = True
    # `complete` only reshapes the target run it is given (no store or network call), so
    # an async caller may run it in place rather than on a thread.
    complete_is_pure: bool = False
    # A wait on several runs (`WaitFor.also`) is answered when one of them ends; with
    # `ready`, only once `ready` says so (else it waits on for the others or the deadline).
    ready: Readiness | None = None


# Which tools a session is offered (`tools.offer.tools_for_session`), given the session's
# stored entry when the caller has just read it (None: read it if needed).
Offer = Callable[["Services", ToolContext, Mapping[str, Any] | None], list[ToolSpec]]
# Which of the MCP and Python tools (their names) a session may use
# (`tools.offer.external_for_session`).
ExternalOffer = Callable[
    ["Services", ToolContext, Sequence[str], Mapping[str, Any] | None], list[str]
]


class ExtraTools(Protocol):
    """The MCP servers and Python tools of a process (`runtime.external_tools`)."""

    def known_names(self) -> list[str]:
        """The tools' names as known in this process."""
        ...

    def toolset(self, permit: Callable[[Sequence[str]], Collection[str]]) -> Any:
        """A run's toolset (a pydantic-ai toolset) of the tools ``permit`` lets it use, or
        None when there are none."""
        ...


@dataclass
class ToolRegistry:
    """The tools known to this process, by name, and which of them a session is offered."""

    tools: dict[str, ToolSpec] = field(default_factory=dict)
    # Set with the tools (`tools.catalog.register_session_tools`): the offer is policy the
    # runtime must not import. Without one every tool is offered.
    offer: Offer | None = None
    # The same policy for the MCP and Python tools (None: all of them).
    external: ExternalOffer | None = None

    def register(self, spec: ToolSpec) -> ToolSpec:
        """Add (or replace) a tool."""
        self.tools[spec.name] = spec
        return spec

    def get(self, name: str) -> ToolSpec | None:
        """A tool by name."""
        return self.tools.get(name)

    def names(self) -> list[str]:
        """All tool names, sorted."""
        return sorted(self.tools)

    def select(self, names: Iterable[str]) -> list[ToolSpec]:
        """The tools with these names, in registry order."""
        wanted = set(names)
        return [t for n, t in self.tools.items() if n in wanted]

    def permitted_external(
        self, ctx: ToolContext, names: Sequence[str], session: Mapping[str, Any] | None = None
    ) -> list[str]:
        """Of the MCP and Python tools ``names``, those the acting session may use."""
        if self.external is None:
            return list(names)
        return self.external(ctx.services, ctx, names, session)

    def offered(self, ctx: ToolContext, session: Mapping[str, Any] | None = None) -> list[ToolSpec]:
        """The tools the acting session may use (``session``: its entry, when just read)."""
        if self.offer is None:
            return list(self.tools.values())
        return self.offer(ctx.services, ctx, session)


@dataclass
class Services:
    """Store, config, queue and tools: everything domain code needs, passed down."""

    store: Store
    config: SwitchboardConfig
    settings: Settings
    queue: TaskQueue
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    # This process's Prometheus counters (`shared.metrics`).
    metrics: Metrics = field(default_factory=Metrics)
    # Told as runs start and end here (a worker's task events for Flower).
    watch: RunWatch = field(default_factory=Unwatched)
    # The MCP servers and Python tools runs get beside the session tools (None: none).
    extra_tools: ExtraTools | None = None
    # Called after a run ends (flows: reply-back, announces); run by the worker.
    on_run_end: list[RunHook] = field(default_factory=list)
    # Set only on the copy of the services a worker task hands a follow-up step it runs in
    # place (`flows.steps.run_step_inline`); None everywhere else.
    inline: InlineStep | None = None
