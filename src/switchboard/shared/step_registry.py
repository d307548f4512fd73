"""The registry of flow steps: domain functions the worker runs as named Celery tasks.

A module declares ``@flow_step("switchboard.<name>")`` on a function
``(services, *ids) -> None``; the worker registers every step as a task (late ack,
retried on Redis errors). Steps must be idempotent: a step may run twice. ``log_ids``
names the step's arguments for its log lines (``("flowId", "turn")``).

A step may also have a form that runs many of it at once (``@together_step(name)``):
given (services, args) per step, it answers each one's failure (None: done).

The registry sits below the flows and delivery, so a delivery step declares itself here
without importing the flows that run steps (`switchboard.shared.flows.steps`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from switchboard.shared.services import Services

FlowStep = Callable[..., None]
# Many steps of one name at once: (services, args) each in, each one's failure out.
TogetherStep = Callable[
    [Sequence[tuple["Services", Sequence[str]]]], Sequence[BaseException | None]
]

FLOW_STEPS: dict[str, FlowStep] = {}
FLOW_STEPS_TOGETHER: dict[str, TogetherStep] = {}
# The log field name of each step argument, by step name.
_LOG_IDS: dict[str, tuple[str, ...]] = {}


def flow_step(name: str, *, log_ids: tuple[str, ...] = ()) -> Callable[[FlowStep], FlowStep]:
    """Register a function as the step named ``name``."""

    def register(fn: FlowStep) -> FlowStep:
        if name in FLOW_STEPS and FLOW_STEPS[name] is not fn:
            raise ValueError(f"flow step {name!r} is registered twice")
        FLOW_STEPS[name] = fn
        _LOG_IDS[name] = log_ids
        return fn

    return register


def together_step(name: str) -> Callable[[TogetherStep], TogetherStep]:
    """Register the form of step ``name`` that runs many of it at once."""

    def register(fn: TogetherStep) -> TogetherStep:
        if name in FLOW_STEPS_TOGETHER and FLOW_STEPS_TOGETHER[name] is not fn:
            raise ValueError(f"flow step {name!r} has two forms for many")
        FLOW_STEPS_TOGETHER[name] = fn
        return fn

    return register


def log_fields(name: str, args: Sequence[str]) -> dict[str, str]:
    """Step ``name``'s arguments by their log field names (as its `flow_step` named them)."""
    return dict(zip(_LOG_IDS.get(name, ()), args, strict=False))
