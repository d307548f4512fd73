"""The services a request or task works with, wired once by the composition root."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from switchboard.shared.config import Settings, SwitchboardConfig
from switchboard.shared.queue import TaskQueue
from switchboard.shared.store import Store
from switchboard.shared.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from switchboard.shared.store.runs import RunRecord

RunHook = Callable[["Services", "RunRecord"], None]


@dataclass
class Services:
    """Store, config, queue and tools: everything domain code needs, passed down."""

    store: Store
    config: SwitchboardConfig
    settings: Settings
    queue: TaskQueue
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    # Called after a run ends (flows: reply-back, announces); run by the worker.
    on_run_end: list[RunHook] = field(default_factory=list)
