"""Imports every flow module so their steps are registered (the worker imports this)."""

from __future__ import annotations

from switchboard.shared.step_registry import FLOW_STEPS

# One import per flow module (each registers its steps with @flow_step):
# FLOWS-BEGIN
# isort: split
from switchboard.shared.flows import subagent  # noqa: F401

# isort: split
from switchboard.shared.delivery import dispatch  # noqa: F401
from switchboard.shared.flows import reply_back  # noqa: F401

# isort: split
from switchboard.shared.flows import yield_wake  # noqa: F401

# FLOWS-END

__all__ = ["FLOW_STEPS"]
