"""The sub-agent announce flow: when a child run ends, tell the requester what came of it.

``switchboard.subagent_announce(spawnId)`` is the child run's ``on_end`` step. It freezes
the child's outcome once (status from the runtime, never from model text; the result is
the run's own final text, else the latest tool result), appends the announce to the
requester's transcript exactly once (one Lua step with the state change), delivers it to
the requester's chat with the idempotency key ``announce:<spawnId>``, and cleans up (the
child leaves the active set; ``cleanup: "delete"`` archives it at once, else it is
scheduled for archival). A child of a ``join: "all"`` batch only counts itself; the one
member that completes the count enqueues ``switchboard.batch_join(batchId)``, which sends
one combined announce. Every step may run twice and then does nothing new.

The announce state on the spawn (or batch) hash: "" → ``appended`` (with the transcript
message, atomically) → ``delivered`` (delivery enqueued, ``deliveryId`` recorded); or
``skipped`` (ANNOUNCE_SKIP), ``dropped`` (an orchestrator requester was archived
meanwhile, as OpenClaw drops late results to a finished orchestrator) or ``batched``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from switchboard.shared import keys as sk
from switchboard.shared.delivery import Target, enqueue_delivery, queue_delivery
from switchboard.shared.delivery.targets import target_from_entry, target_from_key
from switchboard.shared.errors import Unavailable
from switchboard.shared.flows import collect
from switchboard.shared.flows.steps import following, read_at_end, read_hash
from switchboard.shared.flows.subagent_archive import archive_session
from switchboard.shared.flows.subagent_parent import start_private_turn
from switchboard.shared.flows.yield_wake import append_announce, current_run, queue_announce
from switchboard.shared.runtime.transcript import latest_tool_result_text
from switchboard.shared.services import Services
from switchboard.shared.step_registry import flow_step, together_step
from switchboard.shared.store import Pipeline
from switchboard.shared.store.runs import RunRecord, now_ms
from switchboard.shared.store.sessions import SessionEntry
from switchboard.shared.store.spawns import AnnounceReads, SpawnRecord, SpawnStore

log = logging.getLogger("switchboard.subagent")

ANNOUNCE_STEP = "switchboard.subagent_announce"
BATCH_JOIN_STEP = "switchboard.batch_join"
ANNOUNCE_SKIP = "ANNOUNCE_SKIP"
# A frozen result longer than this is cut (OpenClaw caps the frozen completion at 100 KiB).
MAX_RESULT_CHARS = 100 * 1024
# While the requester's own run is executing, an announce waits (so it lands after that
# run's messages), retrying every second, for at most this long after the child ended.
_BUSY_WAIT_MS = 60_000
_BUSY_RETRY_S = 1.0
# How many transcript messages are searched for the latest tool result.
_TOOL_RESULT_WINDOW = 100
_STATUS_LABELS = {"ok": "completed successfully", "timeout": "timed out"}
# Announce states after which nothing more is sent.
_SETTLED = ("delivered", "skipped", "dropped")
# What reads the replies of writes queued on a pipeline, once the caller executed it (what
# it answers, if anything, is not used).
Settled = Callable[[Sequence[Any]], object]


# -- steps -------------------------------------------------------------------------------


@flow_step(ANNOUNCE_STEP, log_ids=("spawnId",))
def subagent_announce(svc: Services, spawn_id: str) -> None:
    """Announce a finished child to its requester (or count it towards its batch)."""
    failed = announce_together([(svc, (spawn_id,))])[0]
    if failed is not None:
        raise failed


@together_step(ANNOUNCE_STEP)
def announce_together(
    steps: Sequence[tuple[Services, Sequence[str]]],
) -> list[BaseException | None]:
    """The announce steps of children that ended together, one per (services, [spawnId]):
    what they read in one round trip, then the writes of every plain announce (the
    frozen outcome, the append, the delivery, the clean-up) in one more. A step off the
    plain path (a collector, a ``join: "all"`` member, a private turn, a requester still
    running) makes its own round trips. Answers each step's failure in its place (None:
    done); a store failure fails every step whose round trip it was, and each is retried
    as a step is (steps are idempotent)."""
    failed: list[BaseException | None] = [None] * len(steps)
    if not steps:
        return failed
    store = steps[0][0].store
    reads = store.pipeline()
    to_read: list[tuple[int, Services, SpawnRecord, Callable[[Sequence[Any]], AnnounceReads]]] = []
    for i, (svc, (spawn_id,)) in enumerate(steps):
        try:
            spawn = _to_announce(svc, spawn_id)
            if spawn is not None:
                to_read.append((i, svc, spawn, _queue_context(svc, spawn, reads)))
        except Exception as exc:
            failed[i] = exc
    replies = _round_trip(reads, [i for i, *_ in to_read], failed)
    if replies is None:
        return failed
    writes = store.pipeline()
    queued: list[tuple[int, Settled]] = []
    for i, svc, spawn, read in to_read:
        try:
            settled = _announce_queued(svc, spawn, read(replies), writes)
            if settled is not None:
                queued.append((i, settled))
        except Exception as exc:
            failed[i] = exc
    replies = _round_trip(writes, [i for i, _ in queued], failed)
    for i, settled in queued if replies is not None else ():
        try:
            settled(replies)
        except Exception as exc:
            failed[i] = exc
    return failed


def _round_trip(pipe: Pipeline, steps: Sequence[int], failed: list[BaseException | None]) -> Any:
    """Execute the round trip of ``steps``; its replies, or None with each step failed."""
    if not len(pipe):
        return []
    try:
        return pipe.execute()
    except Exception as exc:
        for i in steps:
            failed[i] = exc
        return None


def _to_announce(svc: Services, spawn_id: str) -> SpawnRecord | None:
    """The spawn to announce; None when there is nothing to do (gone or done)."""
    raw = read_hash(svc, svc.store.ks.spawn(spawn_id))  # read by the child's end step
    spawn = SpawnRecord.from_hash(spawn_id, raw) if raw else None
    if spawn is None or spawn.get("status") == "done":
        return None
    if spawn.get("status") == "starting":
        raise Unavailable(f"spawn {spawn_id} is still being recorded")  # retried shortly
    return spawn


def _announce_queued(
    svc: Services, spawn: SpawnRecord, ctx: AnnounceReads, pipe: Pipeline
) -> Settled | None:
    """One announce given what it read: its writes queued on ``pipe``, answering what
    reads their replies; None when it made its own round trips (or had nothing to do)."""
    records = svc.store.spawns
    if ctx.run is not None and ctx.run.yielded:  # paused (sessions_yield): its wake run ends it
        ctx = replace(ctx, run=current_run(svc, ctx.run))
        if ctx.run is None:
            return None  # the wake run is not recorded yet: its end enqueues this step again
    if ctx.run is not None and not ctx.run.terminal:
        return None  # an early duplicate: the run's end enqueues this step again
    if spawn.get("collect") or ctx.join == "all":
        spawn = _freeze_outcome(svc, records, spawn, ctx.run, ctx.child_session_id)
        if spawn.get("collect"):  # a collector: into the requester's completion log
            collect.record_completion(svc, spawn)
            finish_child(
                svc, records, spawn, joins_all=False, child_exists=ctx.child_session_id is not None
            )
        else:
            _count_towards_batch(svc, records, spawn)
        return None
    # A private turn makes round trips between its writes: on a pipeline of its own.
    own = spawn.get("completionTarget") == "parent"
    on = svc.store.pipeline() if own else pipe
    # The outcome is frozen on the announce's first round trip (`_freeze_outcome`).
    spawn = _freeze_outcome(svc, records, spawn, ctx.run, ctx.child_session_id, pipe=on)
    if _should_wait_for_requester(svc, spawn, ctx.lane_holder):
        settled = _retry_later(svc, spawn.id)
    else:
        announced = _announce_one(svc, records, spawn, ctx, on)
        finished = queue_finish_child(
            svc,
            records,
            spawn,
            joins_all=False,
            child_exists=ctx.child_session_id is not None,
            pipe=on,
        )
        settled = _in_turn(announced, finished)
    if not own:
        return settled
    settled(on.execute())
    return None


def _retry_later(svc: Services, spawn_id: str) -> Settled:
    def retry(replies: Sequence[Any]) -> None:
        svc.queue.enqueue(ANNOUNCE_STEP, spawn_id, countdown_s=_BUSY_RETRY_S)

    return retry


def _in_turn(*steps: Settled) -> Settled:
    def settled(replies: Sequence[Any]) -> None:
        for step in steps:
            step(replies)

    return settled


@flow_step(BATCH_JOIN_STEP, log_ids=("batchId",))
def batch_join(svc: Services, batch_id: str) -> None:
    """Send one combined announce for a ``join: "all"`` batch whose children all ended."""
    records = svc.store.spawns
    batch = records.get_batch(batch_id)
    if batch is None or batch.get("status") == "done":
        return
    members = [m for m in records.get_many(list(batch.get("spawnIds") or [])) if m is not None]
    if records.done_count(batch_id) < int(batch.get("expected") or 0):
        return  # not complete: the member that completes the count enqueues the join
    holder = svc.store.runs.lane_holder(str(batch["requesterKey"]))
    if _should_wait_for_requester(svc, members[0] if members else None, holder):
        svc.queue.enqueue(BATCH_JOIN_STEP, batch_id, countdown_s=_BUSY_RETRY_S)
        return
    _announce_batch(svc, records, batch, members)
    pipe = svc.store.pipeline()
    for member in members:
        finish_child(svc, records, member, joins_all=True, pipe=pipe, execute=False)
    records.update_batch(batch_id, {"status": "done"}, client=pipe)
    records.expire_batch(batch_id, client=pipe)
    pipe.execute()


def fail_unstarted(svc: Services, spawn_id: str, error: str) -> None:
    """End a batch member whose run could not be started (so the batch still completes)."""
    records = svc.store.spawns
    records.freeze(
        spawn_id, {"outcome": "error", "error": f"failed to start: {error}", "endedAt": now_ms()}
    )
    spawn = records.get(spawn_id)
    if spawn is None:
        return
    svc.store.sessions.delete(str(spawn["childKey"]))
    if _joins_all(records, spawn):
        _count_towards_batch(svc, records, spawn)
    else:
        finish_child(svc, records, spawn, joins_all=False)


def _queue_context(
    svc: Services, spawn: SpawnRecord, pipe: Pipeline
) -> Callable[[Sequence[Any]], AnnounceReads]:
    """Queue what the announce reads on ``pipe`` (`SpawnStore.queue_announce_reads`): the
    child's run, the batch's join mode, the requester's lane and what the announce needs
    of the child and requester sessions. Run inline after the child's run, the run and the
    child's session are taken from its end step (`following`, `read_at_end`) and only the
    rest is read."""
    known = following(svc)
    run = known if known is not None and known.run_id == spawn.get("runId") else None
    child_session = None
    if run is not None:
        child_session = read_at_end(svc, svc.store.ks.session(str(spawn["childKey"])))
    return svc.store.spawns.queue_announce_reads(
        pipe,
        spawn,
        check_requester=sk.is_subagent_key(str(spawn["requesterKey"])),
        read_requester=_target_needs_entry(spawn),
        run=run,
        child_session=child_session,
    )


# -- the outcome -------------------------------------------------------------------------


def _freeze_outcome(
    svc: Services,
    records: SpawnStore,
    spawn: SpawnRecord,
    run: RunRecord | None,
    child_session_id: str | None,
    pipe: Pipeline | None = None,
) -> SpawnRecord:
    """Record the child's outcome and result once; later calls read what was recorded.

    On ``pipe`` the freeze is queued, and the outcome answered is the one computed here:
    a copy of this step racing another computes the same one from the same ended run
    (but for the times of a run record that expired), and the announce it makes lands
    only if it wins the announce's own once-only move."""
    if spawn.get("outcome"):
        return spawn
    child = str(spawn["childKey"])
    status = run.status if run is not None else "error"
    error = run.error if run is not None else "the child run record expired"
    text, source = ((run.reply or "").strip() if run is not None else ""), "reply"
    if not text:
        tail = svc.store.transcripts.tail(child, _TOOL_RESULT_WINDOW)
        text, source = (latest_tool_result_text(tail) or "").strip(), "toolResult"
    if len(text) > MAX_RESULT_CHARS:
        size_kb = len(text) // 1024
        text = text[:MAX_RESULT_CHARS] + (
            f"\n\n[truncated: frozen completion output exceeded 100KB ({size_kb}KB)]"
        )
    fields: dict[str, Any] = {
        "outcome": status,
        "error": error,
        "result": text,
        "resultSource": source if text else None,
        "usage": run.usage if run is not None and run.usage else None,
        "startedAt": run.started_at_ms if run is not None else None,
        "endedAt": (run.ended_at_ms if run is not None else None) or now_ms(),
        "sessionId": child_session_id,
    }
    if pipe is not None:
        records.freeze(spawn.id, fields, client=pipe)
        return spawn.with_fields(fields)
    if records.freeze(spawn.id, fields):
        return spawn.with_fields(fields)  # exactly what the hash now holds
    return records.get(spawn.id) or spawn  # frozen by another step first


def is_silent(spawn: SpawnRecord) -> bool:
    """No announce: the child's own reply is exactly ANNOUNCE_SKIP, or the spawn said
    ``expectsCompletionMessage: false`` (fire-and-forget; the outcome is still recorded)."""
    if spawn.get("expectsCompletionMessage") == "0":
        return True
    return bool(spawn.get("resultSource") == "reply" and spawn.get("result") == ANNOUNCE_SKIP)


# -- announcing ----------------------------------------------------------------------------


def _announce_one(
    svc: Services, records: SpawnStore, spawn: SpawnRecord, ctx: AnnounceReads, pipe: Pipeline
) -> Settled:
    """Append and deliver one child's announce, its writes queued on ``pipe`` after what
    is queued there (the frozen outcome); answers what reads their replies once the
    caller executed it. A private turn executes ``pipe`` on the way (its own pipeline)."""
    spawn_key = svc.store.ks.spawn(spawn.id)
    requester = str(spawn["requesterKey"])
    if spawn.get("announce") in _SETTLED:
        return _nothing
    if is_silent(spawn):
        return _settle_announce(svc, records, spawn_key, "", "skipped", pipe)
    if not ctx.requester_exists:  # an orchestrator archived meanwhile: dropped
        return _settle_announce(svc, records, spawn_key, "", "dropped", pipe)
    text = announce_text(svc, spawn)
    if spawn.get("completionTarget") == "parent":  # a private turn, no channel delivery
        pipe.execute()
        child = str(spawn["childKey"])
        if _append_once(
            svc, records, spawn_key, requester, text, source_key=child, only_yielded=True
        ):
            # The requester yielded: its next run takes it, with its siblings' (yield_wake).
            records.update(spawn.id, {"announcedAt": now_ms()}, client=pipe)
            return _settle_announce(svc, records, spawn_key, "appended", "delivered", pipe)
        run_id = start_private_turn(svc, spawn, text)
        if run_id is None:  # the requester refuses runs: the transcript keeps it
            _append_once(svc, records, spawn_key, requester, text, source_key=spawn["childKey"])
        records.update(spawn.id, {"announceRunId": run_id, "announcedAt": now_ms()}, client=pipe)
        expected = "appended" if run_id is None else ""
        return _settle_announce(svc, records, spawn_key, expected, "delivered", pipe)
    landed = queue_announce(
        svc,
        spawn_key,
        requester,
        _announce_message(text, str(spawn["childKey"])),
        source_key=str(spawn["childKey"]),
        pipe=pipe,
    )
    delivery_id, delivered = queue_delivery(
        svc,
        pipe,
        target=_target(svc, spawn, ctx.requester_entry),
        message=text,
        session_key=requester,
        idempotency_key=f"announce:{spawn.id}",
        origin={"kind": "subagent_announce", "spawnId": spawn.id, "sessionKey": spawn["childKey"]},
    )
    records.update(spawn.id, {"deliveryId": delivery_id, "announcedAt": now_ms()}, client=pipe)
    counted = _settle_announce(svc, records, spawn_key, "appended", "delivered", pipe)
    return _in_turn(landed, delivered, counted)


def _nothing(replies: Sequence[Any]) -> None:
    """Nothing to read in the replies."""


def _announce_batch(
    svc: Services, records: SpawnStore, batch: SpawnRecord, members: Sequence[SpawnRecord]
) -> None:
    batch_key = svc.store.ks.batch(batch.id)
    requester = str(batch["requesterKey"])
    if batch.get("announce") in _SETTLED:
        return
    shown = sorted(
        (m for m in members if not is_silent(m)), key=lambda m: int(m.get("batchIndex", 0))
    )
    if not shown:
        _settle_announce(svc, records, batch_key, "", "skipped")
        return
    if _requester_gone(svc, requester):
        _settle_announce(svc, records, batch_key, "", "dropped")
        return
    text = batch_announce_text(svc, batch, shown)
    _append_once(svc, records, batch_key, requester, text, source_key=str(shown[0]["childKey"]))
    delivery_id = enqueue_delivery(
        svc,
        target=announce_target(svc, shown[0]),
        message=text,
        session_key=requester,
        idempotency_key=f"announce:batch:{batch.id}",
        origin={"kind": "subagent_announce", "batchId": batch.id},
    )
    records.update_batch(batch.id, {"deliveryId": delivery_id, "announcedAt": now_ms()})
    _settle_announce(svc, records, batch_key, "appended", "delivered")


def _settle_announce(
    svc: Services,
    records: SpawnStore,
    hash_key: str,
    expected: str,
    outcome: str,
    pipe: Pipeline | None = None,
) -> Settled:
    """Move the announce state to its outcome, counting the outcome once (metrics) when it
    moved; queued on ``pipe`` when given, then counted from the pipeline's replies by what
    this answers (else counted here, and it answers nothing to do)."""
    if pipe is None:
        if records.cas(hash_key, "announce", expected, outcome):
            svc.metrics.announced("subagent", outcome)
        return _nothing
    moved = records.queue_cas(pipe, hash_key, "announce", expected, outcome)

    def counted(replies: Sequence[Any]) -> None:
        if moved(replies):
            svc.metrics.announced("subagent", outcome)

    return counted


def _append_once(
    svc: Services,
    records: SpawnStore,
    hash_key: str,
    requester: str,
    text: str,
    *,
    source_key: str,
    only_yielded: bool = False,
    pipe: Pipeline | None = None,
) -> bool:
    """Append the announce to the requester's transcript unless this flow already did,
    creating or touching the requester's entry first, in one round trip (with what is
    queued on ``pipe``); a requester that yielded its turn gets it as its next run instead
    (`yield_wake`). With ``only_yielded`` only that: False (nothing written) when the
    requester is not yielded."""
    return append_announce(
        svc,
        hash_key,
        requester,
        _announce_message(text, source_key),
        source_key=source_key,
        only_yielded=only_yielded,
        pipe=pipe,
    )


def _announce_message(text: str, source_key: str) -> dict[str, Any]:
    """The announce as the requester's transcript keeps it."""
    return {
        "role": "user",
        "content": text,
        "timestamp": now_ms(),
        "provenance": {
            "kind": "inter_session",
            "sourceSessionKey": source_key,
            "sourceChannel": "internal",
            "sourceTool": "subagent_announce",
        },
    }


def announce_target(svc: Services, spawn: SpawnRecord) -> Target:
    """The requester's chat: its route at spawn time, else its recorded route, else webchat."""
    entry = None
    if _target_needs_entry(spawn):
        entry = svc.store.sessions.get(str(spawn["requesterKey"]))
    return _target(svc, spawn, entry)


def _target_needs_entry(spawn: SpawnRecord) -> bool:
    """The announce target depends on the requester's entry (see ``_target``)."""
    origin: Mapping[str, Any] = spawn.get("requesterOrigin") or {}
    if origin.get("channel") and origin.get("to"):
        return False
    requester = str(spawn["requesterKey"])
    return not sk.is_subagent_key(requester) and target_from_key(requester) is None


def _target(svc: Services, spawn: SpawnRecord, entry: SessionEntry | None) -> Target:
    origin: Mapping[str, Any] = spawn.get("requesterOrigin") or {}
    if origin.get("channel") and origin.get("to"):
        return Target(
            channel=str(origin["channel"]),
            to=str(origin["to"]),
            account_id=origin.get("accountId"),
            thread_id=origin.get("threadId"),
        )
    requester = str(spawn["requesterKey"])
    if sk.is_subagent_key(requester):
        return Target(channel="internal")  # an orchestrator reads it in its transcript
    found = target_from_key(requester)
    if found is None and entry is not None:
        found = target_from_entry(entry.fields)
    if found is not None:
        return found
    channel = origin.get("channel")
    return Target(channel="internal" if channel == "internal" else "webchat")


def _requester_gone(svc: Services, requester: str) -> bool:
    """An orchestrator sub-agent that was archived meanwhile: late results are dropped."""
    return sk.is_subagent_key(requester) and not svc.store.sessions.exists(requester)


def _should_wait_for_requester(
    svc: Services, spawn: SpawnRecord | None, holder: str | None
) -> bool:
    """The requester's own run (``holder`` holds its lane) is queued to run next (a worker
    about to claim it, or requeued by the sweep after its worker died), executing, or
    parked on a tool call (`subagents wait`: the announce must not land between the call
    and its result): announce after it, unless that takes too long."""
    if spawn is None or not holder:
        return False
    if svc.store.runs.status(holder) not in ("queued", "running", "parked"):
        return False
    return now_ms() - int(spawn.get("endedAt") or 0) < _BUSY_WAIT_MS


# -- batches ------------------------------------------------------------------------------


def _joins_all(records: SpawnStore, spawn: SpawnRecord) -> bool:
    batch_id = spawn.get("batchId")
    return bool(batch_id) and records.batch_join(str(batch_id)) == "all"


def _count_towards_batch(svc: Services, records: SpawnStore, spawn: SpawnRecord) -> None:
    records.cas(svc.store.ks.spawn(spawn.id), "announce", "", "batched")
    if records.count_done(str(spawn["batchId"]), spawn.id):
        svc.queue.enqueue(BATCH_JOIN_STEP, str(spawn["batchId"]))


# -- after the announce ---------------------------------------------------------------------


def finish_child(
    svc: Services,
    records: SpawnStore,
    spawn: SpawnRecord,
    *,
    joins_all: bool,
    child_exists: bool | None = None,
    pipe: Pipeline | None = None,
    execute: bool = True,
) -> None:
    """Free the requester's slot, then delete (archive now) or schedule archival.

    The writes go in one round trip: on ``pipe`` after what is queued there already
    (executed here unless ``execute`` is False). ``child_exists`` spares a read."""
    pipe = pipe if pipe is not None else svc.store.pipeline()
    settled = queue_finish_child(
        svc, records, spawn, joins_all=joins_all, child_exists=child_exists, pipe=pipe
    )
    if execute:
        settled(pipe.execute())


def queue_finish_child(
    svc: Services,
    records: SpawnStore,
    spawn: SpawnRecord,
    *,
    joins_all: bool,
    child_exists: bool | None = None,
    pipe: Pipeline,
) -> Settled:
    """`finish_child`'s writes queued on ``pipe``; answers what reads their replies once
    the caller executed it (the last member of a batch to finish keeps the batch for the
    retention)."""
    requester, child = str(spawn["requesterKey"]), str(spawn["childKey"])
    records.release_child(requester, child, client=pipe)
    svc.store.yields.release_if_idle(requester, client=pipe)  # its last child: yield over
    if spawn.get("cleanup") == "delete":
        if not archive_session(svc, child) and svc.store.sessions.exists(child):
            records.schedule_archive(child, now_ms(), client=pipe)  # busy: the sweep archives it
    else:
        minutes = svc.config.subagents_for(sk.agent_id_of(requester)).archive_after_minutes
        if minutes > 0 and child_exists is None:
            child_exists = svc.store.sessions.exists(child)
        if minutes > 0 and child_exists:
            records.schedule_archive(child, now_ms() + minutes * 60_000, client=pipe)
    batch_id = str(spawn.get("batchId") or "")
    counted = -1
    if batch_id and not joins_all:
        counted = len(pipe)
        records.count_done(batch_id, spawn.id, client=pipe)
    records.update(spawn.id, {"status": "done"}, client=pipe)
    records.expire(spawn.id, client=pipe)

    def settled(replies: Sequence[Any]) -> None:
        if counted >= 0 and int(replies[counted]):
            records.expire_batch(batch_id)  # the last member of the batch to finish

    return settled


# -- text ---------------------------------------------------------------------------------


def announce_text(svc: Services, spawn: SpawnRecord) -> str:
    """The announce of one child: a headline, Status / Result / Notes, and the stats line."""
    status = str(spawn.get("outcome", "error"))
    headline = f'A subagent task "{task_label(spawn)}" just {status_label(spawn)}.'
    return "\n".join([headline, "", *_status_block(spawn, status), "", stats_line(svc, spawn)])


def batch_announce_text(svc: Services, batch: SpawnRecord, members: Sequence[SpawnRecord]) -> str:
    """One combined announce for a batch: a summary line, then each child's block."""
    counts = Counter(str(m.get("outcome", "error")) for m in members)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    lines = [f"A subagent batch of {len(members)} task(s) finished ({summary})."]
    for n, m in enumerate(members, start=1):
        lines += ["", f"[{n}] {task_label(m)}", *_status_block(m, str(m.get("outcome")))]
        lines.append(stats_line(svc, m))
    return "\n".join(lines)


def _status_block(spawn: SpawnRecord, status: str) -> list[str]:
    notes = (spawn.get("error") or "") if status != "ok" else ""
    return [
        f"Status: {status}",
        f"Result: {spawn.get('result') or '(no output)'}",
        f"Notes: {notes}".rstrip(),
    ]


def task_label(spawn: SpawnRecord) -> str:
    """The label, else the task on one line (shortened), else ``task``."""
    text = spawn.get("label") or " ".join(str(spawn.get("task") or "").split()) or "task"
    return text if len(text) <= 80 else text[:77] + "..."


def status_label(spawn: SpawnRecord) -> str:
    """OpenClaw's status wording: completed successfully | timed out | failed: <error>."""
    status = str(spawn.get("outcome", "error"))
    if status in _STATUS_LABELS:
        return _STATUS_LABELS[status]
    return f"failed: {spawn.get('error') or 'unknown error'}"


def stats_line(svc: Services, spawn: SpawnRecord) -> str:
    """`Stats: runtime … • tokens … • sessionKey … • sessionId … • transcript …[ • cost …]`."""
    usage: Mapping[str, Any] = spawn.get("usage") or {}
    tokens_in, tokens_out = int(usage.get("input") or 0), int(usage.get("output") or 0)
    started, ended = spawn.get("startedAt"), spawn.get("endedAt")
    runtime_ms = ended - started if started and ended else None
    session_id = str(spawn.get("sessionId") or "unknown")
    parts = [
        f"runtime {format_duration(runtime_ms)}",
        f"tokens {format_tokens(tokens_in + tokens_out)} "
        f"(in {format_tokens(tokens_in)} / out {format_tokens(tokens_out)})",
        f"sessionKey {spawn['childKey']}",
        f"sessionId {session_id}",
        f"transcript {sk.transcript_url(spawn['childKey'])}",
    ]
    cost = usage.get("cost") or usage.get("costUsd")
    if isinstance(cost, int | float) and cost > 0:
        parts.append(f"cost ${cost:.4f}")
    return "Stats: " + " • ".join(parts)


def format_duration(ms: int | None) -> str:
    """`n/a`, `<s>s`, `<m>m<s>s` or `<h>h<m>m` (rounded seconds)."""
    if not ms or ms <= 0:
        return "n/a"
    seconds = round(ms / 1000)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60}m"


def format_tokens(count: int) -> str:
    """`0`, the integer, `<x.x>k` (≥1000) or `<x.x>m` (≥1e6)."""
    if count <= 0:
        return "0"
    if count >= 1_000_000:
        return f"{count / 1_000_000:.1f}m"
    if count >= 1000:
        return f"{count / 1000:.1f}k"
    return str(count)
