"""The reply-back loop and the announce of ``sessions_send``, as a chain of idempotent steps.

    target's primary run ends ─▶ a2a_step(flow, 0)
        ├─ round 1: a run in the requester's session (its reply goes to the target)
        │     ends ─▶ a2a_step(flow, 1) ─▶ round 2 in the target's session … (alternating)
        └─ loop over (REPLY_SKIP, no reply, failure, turn cap, or skipped)
              ─▶ a2a_announce(flow): a run on the target session (started by the step
                 that ends the loop, in the same task; a task of its own when recovering)
                    ends ─▶ a2a_deliver(flow): ANNOUNCE_SKIP → silent, else a delivery
                                               to the target's chat (``switchboard.deliver``)

Each run carries its follow-up step as ``on_end`` (enqueued durably when the run ends, even
after a ``sessions_send`` wait timed out). A step reads the reply of the run it follows
(the run's own output, never "the latest message"), advances the flow with a
compare-and-set, then starts the next run with an idempotency key, so a step that runs
twice starts nothing twice. Every outcome is written on the flow (``get_flow``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import EllipsisType
from typing import Any

from switchboard.shared.delivery import enqueue_delivery, resolve_announce_target
from switchboard.shared.errors import StoreUnavailable, SwitchboardError, Unavailable
from switchboard.shared.flows import a2a_rules as rules
from switchboard.shared.flows.a2a_flow import Flow, advance, load_flow, record_once
from switchboard.shared.flows.a2a_flow import advancing as advancing_flow
from switchboard.shared.flows.steps import following, run_of, session_entry
from switchboard.shared.gateway.agent import RunRequest, SendBlocked, check_send_policy, start_run
from switchboard.shared.services import Services
from switchboard.shared.step_registry import flow_step
from switchboard.shared.store.runs import LinkMoved, RunRecord, now_ms
from switchboard.shared.store.sessions import SessionEntry

log = logging.getLogger("switchboard.a2a")

STEP = "switchboard.a2a_step"
ANNOUNCE = "switchboard.a2a_announce"
DELIVER = "switchboard.a2a_deliver"
SOURCE_TOOL = "sessions_send"


def step_after(flow_id: str, turn: int) -> dict[str, Any]:
    """The ``on_end`` of the run of round ``turn``."""
    return {"task": STEP, "args": [flow_id, str(turn)]}


def send_allowed(
    svc: Services, session_key: str, *, entry: SessionEntry | EllipsisType | None = ...
) -> bool:
    """Whether the session's send policy lets a run be started there (``entry``: the
    session's entry when the caller has just read it)."""
    try:
        check_send_policy(svc, session_key, entry=entry)
    except SendBlocked:
        return False
    return True


@flow_step(STEP, log_ids=("flowId", "turn"))
def a2a_step(svc: Services, flow_id: str, turn_text: str) -> None:
    """The run of round ``turn`` ended: start the next round or hand over to the announce."""
    turn = int(turn_text)
    flow = load_flow(svc, flow_id)
    if flow is None:
        log.warning("a2a flow %s not found (expired?)", flow_id)
        return
    if _rekick(svc, flow, turn) or flow.status != "running" or flow.turn != turn:
        return
    run_id = flow.run_id(turn)
    if run_id is None:  # named here when this step follows it (it is that run's end)
        run_id = _followed_run_id(svc, flow, turn)
        if run_id is None:  # sessions_send has not recorded the run yet: retry shortly
            raise Unavailable(f"a2a flow {flow_id}: run of turn {turn} not recorded yet")
        flow = flow.with_fields({f"run:{turn}": run_id})
    rec = run_of(svc, run_id)
    if rec is not None and not rec.terminal:
        log.warning("a2a flow %s: run %s has not ended; ignoring early step", flow_id, run_id)
        return
    _after_run(svc, flow, turn, rec)


def _followed_run_id(svc: Services, flow: Flow, turn: int) -> str | None:
    """The run of round ``turn`` when this step follows it (run inline after it) and the
    step that started it has not recorded it on the flow yet: recorded here (first writer
    wins, and both write the same id)."""
    rec = following(svc)
    if rec is None or rec.meta.get("flowId") != flow.flow_id:
        return None
    primary = rec.meta.get("a2a") == "primary"
    if primary != (turn == 0) or (not primary and rec.meta.get("turn") != turn):
        return None
    return record_once(svc, flow.flow_id, f"run:{turn}", rec.run_id)


def _rekick(svc: Services, flow: Flow, turn: int) -> bool:
    """Finish what a crashed earlier copy of this step advanced but did not start."""
    if flow.status == "running" and flow.turn == turn + 1 and flow.run_id(turn + 1) is None:
        _start_round(svc, flow, turn + 1)
        return True
    if flow.status == "announcing" and flow.turn == turn and flow.get("announceRunId") is None:
        svc.queue.enqueue(ANNOUNCE, flow.flow_id)
        return True
    return False


def _after_run(svc: Services, flow: Flow, turn: int, rec: RunRecord | None) -> None:
    status = rec.status if rec is not None else "error"
    reply = rec.reply if rec is not None and rec.status == "ok" else None
    move = rules.next_move(
        turn=turn,
        max_turns=flow.max_turns,
        skip_reason=flow.get("skipReason"),
        status=status,
        reply=reply,
    )
    fields: dict[str, Any] = {f"round:{turn}": _round_record(flow, turn, rec, status, reply)}
    # The target's entry, read once: where its announce goes, and whether it may run.
    target_entry: SessionEntry | EllipsisType | None = ...
    if turn == 0:
        target_entry = session_entry(svc, flow.target_key)
        fields.update(_primary_fields(svc, flow, reply, target_entry))
    elif move.kind == "round":
        fields["latestReply"] = (reply or "").strip()
    if move.kind == "round":
        if advance(svc, flow, {**fields, "turn": turn + 1}):
            _start_round(svc, _reloaded(svc, flow), turn + 1)
        return
    fields["stopReason"] = move.reason
    if move.kind == "stop":
        advance(svc, flow, {**fields, **_done_fields("not_run")})
        return
    # The flow moves to "announcing" in the step that records the announce run.
    _announce(svc, flow, target_entry, advancing={**fields, "status": "announcing"})


def _primary_fields(
    svc: Services, flow: Flow, reply: str | None, target_entry: SessionEntry | None
) -> dict[str, Any]:
    """What the end of the primary run fixes: round-1 reply and the announce route."""
    first = rules.visible_reply(reply)
    target = resolve_announce_target(svc, flow.target_key, entry=target_entry)
    route = None
    if target is not None:
        route = {
            "channel": target.channel,
            "to": target.to,
            "accountId": target.account_id,
            "threadId": target.thread_id,
        }
        route = {k: v for k, v in route.items() if v is not None}
    return {
        "roundOneReply": first,
        "latestReply": first,
        "announceTarget": route,
        "targetChannel": target.channel if target else "unknown",
    }


def _round_record(
    flow: Flow, turn: int, rec: RunRecord | None, status: str, reply: str | None
) -> dict[str, Any]:
    speaker = "target" if turn == 0 else rules.speaker_of(turn)
    out: dict[str, Any] = {
        "turn": turn,
        "speaker": speaker,
        "sessionKey": flow.target_key if speaker == "target" else flow.requester_key,
        "runId": flow.run_id(turn),
        "status": status,
    }
    if reply is not None:
        out["reply"] = reply
    if rec is not None and rec.error:
        out["error"] = rec.error
    return out


def _reloaded(svc: Services, flow: Flow) -> Flow:
    return load_flow(svc, flow.flow_id) or flow


def _start_round(svc: Services, flow: Flow, turn: int) -> None:
    """Start the run of round ``turn`` in its speaker's own session (idempotently)."""
    speaker = rules.speaker_of(turn)
    requester = flow.requester_key or ""
    session, other = (requester, flow.target_key)
    if speaker == "target":
        session, other = other, session
    if not send_allowed(svc, session):
        _end_loop(svc, flow, turn, "round_denied", status="denied")
        return
    requester_channel = flow.get("requesterChannel")
    other_channel = requester_channel if other == requester else flow.get("targetChannel")
    prompt = rules.reply_step_prompt(
        speaker=speaker,
        turn=turn,
        max_turns=flow.max_turns,
        requester_key=flow.requester_key,
        requester_channel=requester_channel,
        target_display=flow.get("targetDisplay") or flow.target_key,
        target_channel=flow.get("targetChannel") or "unknown",
    )
    try:
        start_run(
            svc,
            RunRequest(
                session_key=session,
                message=flow.get("latestReply") or "",
                channel="webchat",
                idempotency_key=f"a2a:{flow.flow_id}:{turn}",
                extra_system_prompt=prompt,
                provenance=_provenance(other, other_channel),
                meta={"flowId": flow.flow_id, "a2a": "reply", "turn": turn},
                on_end=step_after(flow.flow_id, turn),
                link=(svc.store.ks.flow(flow.flow_id), f"run:{turn}"),
            ),
        )
    except StoreUnavailable:
        raise  # the store is away: retried, not an outcome
    except SwitchboardError as exc:
        _end_loop(svc, flow, turn, "round_error", status="error", error=exc.message)
        return
    svc.metrics.a2a_rounds.inc()


def _end_loop(
    svc: Services, flow: Flow, turn: int, reason: str, *, status: str, error: str | None = None
) -> None:
    """A round could not start: record it and go to the announce."""
    record = {"turn": turn, "speaker": rules.speaker_of(turn), "status": status}
    if error:
        record["error"] = error
    fields = {f"round:{turn}": record, "status": "announcing", "stopReason": reason}
    if advance(svc, flow, fields):
        _announce(svc, flow.with_fields(fields))


def _provenance(source_key: str | None, source_channel: str | None) -> dict[str, str]:
    out = {"kind": "inter_session", "sourceTool": SOURCE_TOOL}
    if source_key:
        out["sourceSessionKey"] = source_key
    if source_channel:
        out["sourceChannel"] = source_channel
    return out


def _done_fields(announce_status: str, **extra: Any) -> dict[str, Any]:
    return {"status": "done", "announceStatus": announce_status, "endedAt": now_ms(), **extra}


@flow_step(ANNOUNCE, log_ids=("flowId",))
def a2a_announce(svc: Services, flow_id: str) -> None:
    """Start the announce run on the target session (once)."""
    flow = load_flow(svc, flow_id)
    if flow is not None:
        _announce(svc, flow)


def _announce(
    svc: Services,
    flow: Flow,
    target_entry: SessionEntry | EllipsisType | None = ...,
    *,
    advancing: Mapping[str, Any] | None = None,
) -> None:
    """Start the announce run on the target session (once): from `a2a_announce` or a loop
    that could not go on (the flow is already "announcing"), or in the step that decided
    the announce, not a message of its own, with the target's entry if the step read it.

    ``advancing``: the fields that step moves the flow on with (to "announcing"), written
    in the step that records the announce run, if the flow is still where the step read it
    (`a2a_flow.advancing`); a copy of the step that finds it moved on does nothing. If
    this fails or the worker dies first, the step is still pending (or in its run's
    outbox) and runs again; a flow left "announcing" with no announce run (by the other
    callers) has `_rekick` enqueue the announce step."""
    read = flow  # as the caller read it: what a compare-and-set expects
    if advancing is not None:
        flow = flow.with_fields(advancing)
    if flow.status != "announcing" or flow.get("announceRunId"):
        return
    flow_id = flow.flow_id
    if not send_allowed(svc, flow.target_key, entry=target_entry):
        error = "send blocked by session policy"
        advance(svc, read, {**(advancing or {}), **_done_fields("denied", announceError=error)})
        return
    prompt = rules.announce_prompt(
        requester_key=flow.requester_key,
        requester_channel=flow.get("requesterChannel"),
        target_display=flow.get("targetDisplay") or flow.target_key,
        target_channel=flow.get("targetChannel") or "unknown",
        original_message=flow.get("message") or "",
        round_one_reply=flow.get("roundOneReply"),
        latest_reply=flow.get("latestReply"),
    )
    try:
        start_run(
            svc,
            RunRequest(
                session_key=flow.target_key,
                message=rules.ANNOUNCE_MESSAGE,
                channel="webchat",
                idempotency_key=f"a2a:{flow_id}:announce",
                extra_system_prompt=prompt,
                provenance=_provenance(flow.requester_key, flow.get("requesterChannel")),
                meta={"flowId": flow_id, "a2a": "announce"},
                on_end={"task": DELIVER, "args": [flow_id]},
                entry=target_entry,
                link=(svc.store.ks.flow(flow_id), "announceRunId"),
                link_advance=advancing_flow(svc, read, advancing) if advancing else None,
            ),
        )
    except LinkMoved:
        log.info("a2a flow %s moved on before its announce started", flow_id)
    except StoreUnavailable:
        raise  # the store is away: retried, not an outcome
    except SwitchboardError as exc:
        ended = _done_fields("error", announceError=exc.message)
        advance(svc, read, {**(advancing or {}), **ended})


@flow_step(DELIVER, log_ids=("flowId",))
def a2a_deliver(svc: Services, flow_id: str) -> None:
    """Judge the announce run's own reply: stay silent, or deliver it to the target's chat."""
    flow = load_flow(svc, flow_id)
    if flow is None or flow.status != "announcing":
        return
    run_id = flow.get("announceRunId")
    if run_id is None:
        raise Unavailable(f"a2a flow {flow_id}: announce run not recorded yet")
    rec = run_of(svc, run_id)
    if rec is not None and not rec.terminal:
        return
    if rec is None or rec.status != "ok":
        error = rec.error if rec is not None else "announce run not found"
        advance(svc, flow, _done_fields("error", announceError=error), expect_turn=False)
        return
    reply = (rec.reply or "").strip()
    advance(svc, flow, _announce_outcome(svc, flow, run_id, reply), expect_turn=False)


def _announce_outcome(svc: Services, flow: Flow, run_id: str, reply: str) -> dict[str, Any]:
    if not reply:
        return _done_fields("empty")
    if reply == rules.ANNOUNCE_SKIP:
        return _done_fields("skipped", announceReply=reply)
    target = flow.announce_target()
    if target is None:
        return _done_fields("no_target", announceReply=reply)
    delivery_id = enqueue_delivery(
        svc,
        target=target,
        message=reply,
        session_key=flow.target_key,
        idempotency_key=f"a2a:{flow.flow_id}:announce",
        origin={"kind": "a2a_announce", "flowId": flow.flow_id, "runId": run_id},
    )
    return _done_fields("delivering", announceReply=reply, deliveryId=delivery_id)
