"""``completionTarget: "parent"``: a child's result as a private turn of its requester.

The default announce is appended to the requester's transcript and delivered to the
requester's chat; the requester's model does not run on it. With ``completionTarget:
"parent"`` nothing is delivered to a channel: the announce starts a run of the requester
session instead (its message is the announce, appended to the transcript when the run is
claimed, exactly once), so the requester's model reads the result and answers it in its
own transcript. The run queues on the requester's lane like any other (after a turn in
progress) and is started once per spawn (idempotency key ``announce:<spawnId>``).
"""

from __future__ import annotations

import logging

from switchboard.shared.errors import StoreUnavailable, SwitchboardError
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
from switchboard.shared.store.spawns import SpawnRecord

log = logging.getLogger("switchboard.subagent")


def start_private_turn(svc: Services, spawn: SpawnRecord, text: str) -> str | None:
    """Start the requester's run on the announce ``text``; its run id, or None when the
    requester's session refuses a run (its send policy), so the caller keeps the announce
    in the transcript instead."""
    try:
        started = start_run(
            svc,
            RunRequest(
                session_key=str(spawn["requesterKey"]),
                message=text,
                idempotency_key=f"announce:{spawn.id}",
                provenance={
                    "kind": "inter_session",
                    "sourceSessionKey": str(spawn["childKey"]),
                    "sourceChannel": "internal",
                    "sourceTool": "subagent_announce",
                },
                meta={"spawnId": spawn.id, "completionTarget": "parent"},
            ),
        )
    except StoreUnavailable:
        raise  # the store is away: the step is retried
    except SwitchboardError as exc:
        log.warning("spawn %s: the requester's private turn was refused: %s", spawn.id, exc)
        return None
    return str(started["runId"])
