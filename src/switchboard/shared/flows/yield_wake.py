"""The wake of a yielded session: its children's announces start its next run, batched.

A session that called ``sessions_yield`` is *yielded* (``yieldedAt`` on its entry) until
no child it spawned is pending any more. While it is, a child's announce does not land in
its transcript; it is stashed in the session's yield inbox, in the same script that moves
the announce's state (`append_announce`, ``yield_announce.lua``), and the first announce
after the last take opens a wake: the marker ``sb:ywake:<key>`` names a new wake id (SET
only when none is open) and ``switchboard.yield_wake(sessionKey, wakeId)`` is enqueued
``BATCH_WINDOW_S`` later. Announces arriving meanwhile join the open wake's inbox.

The step takes the inbox once (``yield_take.lua``: the announces move to the wake hash
``sb:wake:<wakeId>``, the marker and inbox are deleted, and the session stops being
yielded when none of its children is pending any more), then starts the session's next run
whose message holds every announce taken, with the idempotency key
``yield-wake:<wakeId>``. An announce arriving after the take opens the next wake (a run
queued behind the first on the session lane).

Durable: the inbox, the marker and the wake live in Redis; the step is a pending flow step
(``flows/pending.py``), so one lost with a killed worker is enqueued again by the sweep; a
step run again finds its wake taken and starts the same run (the idempotency key), or does
nothing once the run is recorded. An announce step run again after its stash (a worker lost
between the stash and the enqueue) enqueues the open wake again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.gateway.agent import RunRequest, SendBlocked, start_run
from switchboard.shared.services import Services
from switchboard.shared.step_registry import flow_step
from switchboard.shared.store import Pipeline
from switchboard.shared.store.runs import RunRecord, now_ms
from switchboard.shared.store.yields import WakeTake, YieldStore

log = logging.getLogger("switchboard.yield")

WAKE_STEP = "switchboard.yield_wake"
# The batching window: the wake step runs this long after the announce that opened it, so
# announces landing within it (children that end close together) make one message.
BATCH_WINDOW_S = 1.0
# How many yields in a row `current_run` follows.
_MAX_CHAIN = 100


def append_announce(
    svc: Services,
    hash_key: str,
    requester: str,
    message: Mapping[str, Any],
    *,
    source_key: str,
    only_yielded: bool = False,
    pipe: Pipeline | None = None,
) -> bool:
    """Land an announce once (moving ``announce`` "" → "appended" on ``hash_key``): in the
    requester's yield inbox when it is yielded (opening a wake if none is open), else in
    its transcript, or with ``only_yielded`` nowhere (False: the caller announces its own
    way). The requester's entry is created or touched first, in the same round trip: on
    ``pipe`` after what is queued there already, when given."""
    pipe = pipe if pipe is not None else svc.store.pipeline()
    landed = queue_announce(
        svc,
        hash_key,
        requester,
        message,
        source_key=source_key,
        only_yielded=only_yielded,
        pipe=pipe,
    )
    return landed(pipe.execute())


def queue_announce(
    svc: Services,
    hash_key: str,
    requester: str,
    message: Mapping[str, Any],
    *,
    source_key: str,
    only_yielded: bool = False,
    pipe: Pipeline,
) -> Callable[[Sequence[Any]], bool]:
    """`append_announce` queued on ``pipe``: answers what reads its reply once the caller
    executed the pipeline (and enqueues the wake it opened), True unless ``only_yielded``
    found the requester not yielded."""
    now = now_ms()
    entry = {"childKey": source_key, "text": message["content"], "at": now}
    svc.store.sessions.touch(requester, client=pipe)
    at = len(pipe)
    svc.store.yields.append_announce(
        hash_key,
        requester,
        message,
        entry,
        field="announce",
        expected="",
        new="appended",
        now_ms=now,
        wake_id=svc.store.ks.new_id_beside(requester),
        only_yielded=only_yielded,
        client=pipe,
    )

    def landed(replies: Sequence[Any]) -> bool:
        found = YieldStore.landed(replies[at])
        # A new wake, or one left open by an earlier copy of this step that died before it
        # enqueued the step (enqueued twice is harmless: the step is idempotent).
        if found.wake_id and (found.opened or found.outcome == "moved"):
            svc.queue.enqueue(WAKE_STEP, requester, found.wake_id, countdown_s=BATCH_WINDOW_S)
        return found.outcome != "not_yielded"

    return landed


def stash_for_wake(
    svc: Services, hash_key: str, requester: str, message: Mapping[str, Any], *, source_key: str
) -> bool:
    """Stash an announce for the requester's next run if it is yielded (`append_announce`);
    False, with nothing written, when it is not."""
    return append_announce(
        svc, hash_key, requester, message, source_key=source_key, only_yielded=True
    )


@flow_step(WAKE_STEP, log_ids=("sessionKey", "wakeId"))
def yield_wake(svc: Services, session_key: str, wake_id: str) -> None:
    """Take the yielded session's announces and start its next run with them."""
    yields = svc.store.yields
    take = yields.take(session_key, wake_id, now_ms())
    if take.status != "taken":
        return  # another wake's (stale) or already started
    if not take.announces:
        yields.started(wake_id, "")
        return
    message = wake_message([str(a.get("text") or "") for a in take.announces])
    yielded = svc.store.runs.get(take.yielded_run_id) if take.yielded_run_id else None
    try:
        started = start_run(svc, _wake_request(svc, session_key, wake_id, take, yielded, message))
    except SendBlocked:
        # The session's send policy refuses runs: keep the results in its transcript.
        log.warning("yielded session %s may not run; its announces are kept", session_key)
        provenance = _wake_request(svc, session_key, wake_id, take, None, message).provenance
        svc.store.transcripts.append(
            session_key, {"role": "user", "content": message, "provenance": provenance}, now_ms()
        )
        yields.started(wake_id, "")
        return
    yields.started(wake_id, str(started["runId"]))
    log.info("yielded session %s woken by %d announce(s)", session_key, len(take.announces))


def _wake_request(
    svc: Services,
    session_key: str,
    wake_id: str,
    take: WakeTake,
    yielded: RunRecord | None,
    message: str,
) -> RunRequest:
    """The wake run: the announces as its message, the yielding run's system prompt, model
    and timeout, and the yield's note. A sub-agent's yielded run hands its follow-up (its
    completion announce) to the wake run, which is named on the yielded run (``wakeRunId``,
    in the step that records it) so the announce step follows the chain (`current_run`)."""
    meta: dict[str, Any] = {"yieldWake": wake_id}
    on_end = link = None
    if yielded is not None and yielded.on_end and sk.is_subagent_key(session_key):
        on_end = yielded.on_end
        link = (svc.store.ks.run(yielded.run_id), "wakeRunId")
        meta.update({k: v for k, v in yielded.meta.items() if k == "spawnId"})
    prompts = [yielded.extra_system_prompt if yielded is not None else None]
    return RunRequest(
        session_key=session_key,
        message=message,
        idempotency_key=f"yield-wake:{wake_id}",
        provenance={
            "kind": "inter_session",
            "sourceSessionKey": str(take.announces[0].get("childKey") or ""),
            "sourceChannel": "internal",
            "sourceTool": "subagent_announce",
        },
        extra_system_prompt="\n\n".join(
            p for p in [*prompts, resume_prompt(take.yield_message)] if p
        ),
        model=yielded.model if yielded is not None else None,
        timeout_s=yielded.timeout_s if yielded is not None else None,
        meta=meta,
        on_end=on_end,
        link=link,
    )


def current_run(svc: Services, rec: RunRecord) -> RunRecord | None:
    """The run that continues ``rec`` across its yields (its wake's run, and that one's,
    ...); None while a yielded run's wake run is not recorded yet (its end brings the
    follow-up again)."""
    for _ in range(_MAX_CHAIN):
        if not rec.yielded:
            return rec
        nxt = svc.store.runs.get(rec.wake_run_id) if rec.wake_run_id else None
        if nxt is None:
            return None
        rec = nxt
    return None


def wake_message(texts: Sequence[str]) -> str:
    """One announce as is; several as one message, numbered in arrival order."""
    if len(texts) == 1:
        return texts[0]
    parts = [f"{len(texts)} subagent results arrived while this session was yielded."]
    parts += [f"[{n}] {text}" for n, text in enumerate(texts, start=1)]
    return "\n\n".join(parts)


def resume_prompt(yield_message: str) -> str:
    """The private context the yielding call left for the resumed turn."""
    note = yield_message or "Turn yielded."
    return (
        "You ended your previous turn with sessions_yield; the results of your sub-agents "
        f"are this turn's message. Your note for this turn: {note}"
    )
