"""Where a sub-agent's completion delivery stands, in OpenClaw 2026.9.6's vocabulary.

One answer for the ``subagents`` tool's rows and the console's session tree: ``pending``
until the announce is sent, then ``delivered`` (its channel delivery's own outcome when it
has one: ``failed`` if that failed or was denied), ``session_queued`` (a private turn that
could not start: the announce waits in the requester's session), ``dismissed``
(ANNOUNCE_SKIP), ``parent_missing`` (the requester was archived) or ``not_applicable`` (a
collector child, or no announce asked).
"""

from __future__ import annotations

from collections.abc import Sequence

from switchboard.shared.services import Services
from switchboard.shared.store.run_records import ANNOUNCE_DELIVERY_STATUS
from switchboard.shared.store.spawns import SpawnRecord

# A delivery record's status as the completion's delivery status.
_DELIVERY_STATUS = {"delivered": "delivered", "failed": "failed", "denied": "failed"}


def delivery_status(svc: Services, spawn: SpawnRecord) -> str:
    """The completion delivery status of one spawn (`DELIVERY_STATUSES`)."""
    if spawn.get("collect") or spawn.get("expectsCompletionMessage") == "0":
        return "not_applicable"  # collected with agents_wait, or no announce asked
    announce = str(spawn.get("announce") or "")
    delivery_id = spawn.get("deliveryId")
    if announce == "batched" and spawn.get("batchId"):
        batch = svc.store.spawns.get_batch(str(spawn["batchId"]))
        announce = str(batch.get("announce") or "") if batch else ""
        delivery_id = batch.get("deliveryId") if batch else None
    if announce in ("skipped", "dropped"):
        return ANNOUNCE_DELIVERY_STATUS[announce]
    if announce != "delivered":
        return "pending"
    if not delivery_id:  # completionTarget: parent, a private turn of the requester
        return "delivered" if spawn.get("announceRunId") else "session_queued"
    delivery = svc.store.deliveries.get(str(delivery_id))
    status = str(delivery.get("status") or "") if delivery else "delivered"
    return _DELIVERY_STATUS.get(status, "pending")


def delivery_statuses(svc: Services, spawn_ids: Sequence[str]) -> dict[str, str]:
    """The completion delivery status of each of these spawns (by spawn id; a spawn gone
    meanwhile is left out), its records read in one round trip."""
    records = svc.store.spawns.get_many(list(spawn_ids))
    return {s.id: delivery_status(svc, s) for s in records if s is not None}
