"""Channel adapters and durable delivery records (``switchboard.deliver``).

The public surface: ``Target``, ``enqueue_delivery``, ``get_delivery``, ``deliveries_for``
and ``resolve_announce_target``.
"""

from switchboard.shared.delivery.dispatch import (
    DELIVER_STEP,
    deliveries_for,
    enqueue_delivery,
    get_delivery,
)
from switchboard.shared.delivery.records import Target
from switchboard.shared.delivery.targets import resolve_announce_target

__all__ = [
    "DELIVER_STEP",
    "Target",
    "deliveries_for",
    "enqueue_delivery",
    "get_delivery",
    "resolve_announce_target",
]
