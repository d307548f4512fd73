"""Imports every flow module so their steps are registered (the worker imports this)."""

from __future__ import annotations

from switchboard.shared.flows.steps import FLOW_STEPS

# One import per flow module (each registers its steps with @flow_step):
# FLOWS-BEGIN
# FLOWS-END

__all__ = ["FLOW_STEPS"]
