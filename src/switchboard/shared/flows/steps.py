"""The registry of flow steps: domain functions the worker runs as named Celery tasks.

A flow module declares ``@flow_step("switchboard.<name>")`` on a function
``(services, *ids) -> None``; the worker registers every step as a task (late ack,
retried on Redis errors). Steps must be idempotent: a step may run twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from switchboard.shared.services import Services

FlowStep = Callable[..., None]

FLOW_STEPS: dict[str, FlowStep] = {}


def flow_step(name: str) -> Callable[[FlowStep], FlowStep]:
    """Register a function as the step named ``name``."""

    def register(fn: FlowStep) -> FlowStep:
        if name in FLOW_STEPS and FLOW_STEPS[name] is not fn:
            raise ValueError(f"flow step {name!r} is registered twice")
        FLOW_STEPS[name] = fn
        return fn

    return register


def run_step(services: Services, name: str, *args: str) -> None:
    """Run a registered step (the worker's task body)."""
    FLOW_STEPS[name](services, *args)
