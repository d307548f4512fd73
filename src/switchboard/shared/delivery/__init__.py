"""Channel adapters and durable delivery records (``switchboard.deliver``).

The public surface: ``Target``, ``enqueue_delivery`` (``queue_delivery``: its store step
on a pipeline the caller executes), ``get_delivery``, ``deliveries_for``,
``resolve_announce_target`` and, for the sweep, ``enqueue_due``.
"""

from switchboard.shared.delivery.dispatch import (
    DELIVER_STEP,
    deliveries_for,
    enqueue_delivery,
    enqueue_due,
    get_delivery,
    queue_delivery,
)
from switchboard.shared.delivery.records import Target
from switchboard.shared.delivery.targets import resolve_announce_target

__all__ = [
    "DELIVER_STEP",
    "Target",
    "deliveries_for",
    "enqueue_delivery",
    "enqueue_due",
    "get_delivery",
    "queue_delivery",
    "resolve_announce_target",
]
