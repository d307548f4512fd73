"""Execute one agent run (or resume a parked one) on pydantic-ai, with the product's deadline.

The worker calls ``execute_run`` / ``resume_run`` with a run id. The run is claimed in
Redis (only the lane holder in the expected state may run; the attempt number guards
every later write), the session history is loaded from the transcript, the model runs
with the session's tools, and the outcome is written in one atomic step that also hands
the lane to the next queued run and wakes parked waiters.

A run's follow-up step (its ``onEnd``) is enqueued when the run ends. A caller that runs
follow-ups itself (the worker's inline execution) passes a ``follow_ups`` list instead: the
ended runs are collected there, and the caller runs their steps (this layer knows no flow
step; the worker hands them to ``shared.flows``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypedDict, Unpack

from pydantic_ai.exceptions import AgentRunError, FallbackExceptionGroup
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.toolsets import AbstractToolset, CombinedToolset

from switchboard import telemetry
from switchboard.logs import bind_run
from switchboard.shared import keys as sk
from switchboard.shared.errors import StoreUnavailable, SwitchboardError
from switchboard.shared.runtime.agent_loop import RunResult, TurnEnded, run_model_loop
from switchboard.shared.runtime.attachments import with_attachments
from switchboard.shared.runtime.cancel_signal import (
    CANCELLED_TEXT,
    SUPERSEDED,
    CancelSignal,
    RunCancelled,
    RunSuperseded,
)
from switchboard.shared.runtime.client_tools import (
    CLIENT_CALLS_FIELD,
    answer_left_calls,
    client_calls,
    client_toolset,
    last_text,
    tool_returns,
    tool_settings,
)
from switchboard.shared.runtime.history_cache import model_history
from switchboard.shared.runtime.leases import FENCED, keeper_for
from switchboard.shared.runtime.models import resolve_model
from switchboard.shared.runtime.off_loop import off_loop
from switchboard.shared.runtime.steering import Steering, restore_steered
from switchboard.shared.runtime.together import Together
from switchboard.shared.runtime.toolset import ToolRun, toolset_for
from switchboard.shared.runtime.transcript import to_model_messages, to_transcript
from switchboard.shared.services import Services, ToolContext, WaitFor
from switchboard.shared.store import Pipeline, codec
from switchboard.shared.store.events import run_event
from switchboard.shared.store.keyspace import EVENTS_MAXLEN
from switchboard.shared.store.runs import Claim, ParkedCall, RunEnd, RunRecord, now_ms

log = logging.getLogger("switchboard.run")

# A run's error when it ends `lost`: its workers vanished until no attempt was left.
LOST_TEXT = "run lost: its worker vanished and no retry was left (repeated worker loss)"

# How many transcript messages a run sees as history.
HISTORY_LIMIT = 200


# Where a caller collects the runs that ended with a follow-up step, to run those steps
# itself; None: each step is enqueued as the run ends (the plain path).
FollowUps = list[RunRecord] | None

# Called once a run's claim (or resume) step has answered, whatever it answered: from then
# on the run's state in the store is all it needs (a worker that dies leaves it to the
# sweep). The worker acks the run's message there, not when the run ends.
OnClaimed = Callable[[], None] | None


async def execute_run(
    svc: Services,
    run_id: str,
    session_key: str | None = None,
    *,
    claim: Claim | str | None = None,
    follow_ups: FollowUps = None,
    on_claimed: OnClaimed = None,
    ends: EndsTogether | None = None,
) -> None:
    """Claim and execute a queued run that holds its session lane.

    ``session_key`` is the one the run was enqueued with: the claim then reads the run,
    its session and its history in the same step. ``claim``: the run was claimed already
    (as it started, `RunStore.start` with ``claim_history``): execute it as claimed, or
    not at all when the claim answered a reason not to. ``follow_ups``: collect the run
    there if it ends with a follow-up step, instead of enqueuing the step. ``on_claimed``:
    called once the claim step answered (see `OnClaimed`). ``ends``: record the run's
    result with the results of the runs of its loop that came in beside it
    (`record_results`)."""
    claimed = claim
    if isinstance(claimed, Claim) and claimed.run is None:
        claimed = None  # a start that did not claim it: claimed here
    if claimed is None:
        if session_key is None:
            found = svc.store.runs.get(run_id)
            if found is None:
                log.warning("run %s not found; nothing to do", run_id)
                return
            session_key = found.session_key
        claimed = svc.store.runs.claim(run_id, session_key, history=HISTORY_LIMIT)
        if isinstance(claimed, Claim) and claimed.first:
            svc.metrics.run_started()
    if on_claimed is not None:
        on_claimed()
    if isinstance(claimed, str):
        if claimed.startswith("missing:"):
            log.warning("run %s not found; nothing to do", run_id)
        else:
            log.info("run %s not executed (%s)", run_id, claimed)
        return
    assert claimed.run is not None
    bind_run(claimed.run)  # this run's ids on every log line until it ends
    await _execute(svc, claimed.run, claimed, deferred=None, follow_ups=follow_ups, ends=ends)


async def resume_run(
    svc: Services,
    run_id: str,
    *,
    follow_ups: FollowUps = None,
    on_claimed: OnClaimed = None,
    ends: EndsTogether | None = None,
) -> None:
    """Continue a parked run once every call it waits on has an answer or timed out
    (``follow_ups``, ``on_claimed`` and ``ends`` as for `execute_run`)."""
    rec = svc.store.runs.get(run_id)
    if rec is None or rec.status != "parked":
        return
    bind_run(rec)
    calls = [ParkedCall.from_json(c) for c in rec.parked]
    ids = [t for c in calls for t in c.target_run_ids]
    found = dict(zip(ids, svc.store.runs.get_many(ids), strict=True))
    targets = [_answering(c, found) for c in calls]
    now = now_ms()
    if not all(_call_ready(svc, rec, c, t, now) for c, t in zip(calls, targets, strict=True)):
        return  # another target's end (or the deadline sweep) resumes it later
    claim = svc.store.runs.resume(run_id, rec.session_key, history=HISTORY_LIMIT)
    if on_claimed is not None:
        on_claimed()
    if isinstance(claim, str):
        return
    ctx = _tool_context(svc, rec, claim.session)
    results = [
        ToolReturnPart(
            tool_name=c.tool_name,
            content=_complete_call(svc, ctx, c, t),
            tool_call_id=c.tool_call_id,
        )
        for c, t in zip(calls, targets, strict=True)
    ]
    await _execute(svc, rec, claim, deferred=results, follow_ups=follow_ups, ends=ends)


def _answering(call: ParkedCall, found: Mapping[str, RunRecord | None]) -> RunRecord | None:
    """The run a call is answered with: the first of its targets that ended (or is gone),
    else its first target."""
    for run_id in call.target_run_ids:
        target = found.get(run_id)
        if target is None or target.terminal:
            return target
    return found.get(call.target_run_id)


def _call_ready(
    svc: Services, rec: RunRecord, call: ParkedCall, target: RunRecord | None, now: int
) -> bool:
    """A parked call can be answered: its deadline passed, or a target ended and the
    tool's `ready` (if any) agrees."""
    if now >= call.deadline_ms:
        return True
    if target is not None and not target.terminal:
        return False
    spec = svc.tools.get(call.tool_name)
    if spec is None or spec.ready is None:
        return True
    return spec.ready(_tool_context(svc, rec), call.context)


def _complete_call(
    svc: Services, ctx: ToolContext, call: ParkedCall, target: RunRecord | None
) -> dict[str, Any]:
    spec = svc.tools.get(call.tool_name)
    if spec is None or spec.complete is None:
        return {"status": "error", "error": f"tool {call.tool_name} cannot be resumed"}
    try:
        return spec.complete(ctx, call.context, target)
    except StoreUnavailable:
        raise  # the store is away: retried, not an outcome
    except SwitchboardError as exc:
        return {"status": "error", "tool": call.tool_name, "error": exc.message}


async def _execute(
    svc: Services,
    rec: RunRecord,
    claim: Claim,
    deferred: Sequence[ToolReturnPart] | None,
    follow_ups: FollowUps,
    ends: EndsTogether | None,
) -> None:
    # The run's `invoke_agent` span (tracing on), in the trace that created the run.
    with telemetry.invoke_agent(rec.session_key, rec.run_id, parent=rec.traceparent):
        await _execute_traced(svc, rec, claim, deferred, follow_ups, ends)


async def _execute_traced(
    svc: Services,
    rec: RunRecord,
    claim: Claim,
    deferred: Sequence[ToolReturnPart] | None,
    follow_ups: FollowUps,
    ends: EndsTogether | None = None,
) -> None:
    if deferred is None:  # a resumed run goes on: it started before
        svc.watch.started(rec, claim)
    if rec.cancel_requested or (claim.run is not None and claim.run.cancel_requested):
        _end_cancelled(svc, rec, claim, follow_ups)  # asked while its last worker ran it
        return
    if claim.exhausted:
        _finish(svc, rec, claim, follow_ups, status="lost", error=LOST_TEXT)
        return
    if not claim.started_published:  # a fresh claim adds the event itself
        started = run_event(rec, attempt=claim.attempt, resumed=deferred is not None or None)
        svc.store.events.publish("run.started", started)
    steering = Steering.at_claim(svc.store.steering, rec.session_key, claim.session)
    while True:
        try:
            await _execute_steered(svc, rec, claim, deferred, follow_ups, ends, steering)
            return
        except RunSteered as steered:  # its end found messages steered in: it goes on
            log.info("run %s goes on with %d steered message(s)", rec.run_id, len(steered.waiting))
            steering = steering.continued(steered.waiting)
            # What it said so far is in the transcript now: its history is read from there.
            claim = replace(claim, history=None, entries=None)
            deferred = None


class RunSteered(Exception):
    """A run's end step did not end it: messages were steered into the turn meanwhile
    (``waiting``, transcript form); what it said so far is in the transcript."""

    def __init__(self, waiting: Sequence[Mapping[str, Any]]) -> None:
        super().__init__(f"{len(waiting)} steered message(s) waiting")
        self.waiting = list(waiting)


async def _execute_steered(
    svc: Services,
    rec: RunRecord,
    claim: Claim,
    deferred: Sequence[ToolReturnPart] | None,
    follow_ups: FollowUps,
    ends: EndsTogether | None,
    steering: Steering,
) -> None:
    """Run the model loop and record its result (raises `RunSteered` when the end step
    hands the turn messages steered into it meanwhile)."""
    remaining_s = (claim.deadline_at_ms - now_ms()) / 1000
    if remaining_s <= 0:
        _finish(
            svc, rec, claim, follow_ups, status="timeout", error=_timeout_text(rec), aborted=True
        )
        return
    # The lane's lease is renewed while the run executes (one keeper per process), fenced by
    # the attempt; a cancel request for it (`subagents cancel`) stops it, and so does the
    # keeper finding another attempt has it (this worker was cut off past its lease). The
    # block holds the agent loop only: every end step comes after it, so the keeper never
    # renews (and finds refused) the lease of a run this worker itself just ended.
    stop = CancelSignal()
    keeper = keeper_for(svc.store.runs)
    end: Callable[[], object] | None = None  # an end other than a result, made after the block
    with keeper.holding(
        rec.session_key,
        rec.run_id,
        stop.fire,
        attempt=claim.attempt,
        on_superseded=lambda: stop.fire(SUPERSEDED),
    ):
        try:
            async with asyncio.timeout(remaining_s):
                result = await stop.run(_run_agent(svc, rec, claim, deferred, steering))
        except RunCancelled:
            if stop.reason == SUPERSEDED:  # another attempt has it: nothing of ours is kept
                log.warning("run %s attempt %d stopped: superseded", rec.run_id, claim.attempt)
                return
            end = partial(_end_cancelled, svc, rec, claim, follow_ups)
        except RunSuperseded:  # found before a tool call: no tool ran, nothing is written
            _log_fenced(rec, claim, "tool calls")
            log.warning("run %s attempt %d stopped: superseded", rec.run_id, claim.attempt)
            return
        except TimeoutError:
            error = _timeout_text(rec)
            end = partial(
                _finish, svc, rec, claim, follow_ups, status="timeout", error=error, aborted=True
            )
        except StoreUnavailable:
            # The store went away mid-run: not the run's fault. Its lane lease lapses and the
            # sweep runs it again once the store is back.
            raise
        except SwitchboardError as exc:
            end = partial(_finish, svc, rec, claim, follow_ups, status="error", error=exc.message)
        except (AgentRunError, FallbackExceptionGroup) as exc:  # the model or its provider
            # An ordinary outcome: the run's end line names it; the traceback is for DEBUG.
            error = f"{type(exc).__name__}: {exc}"
            log.debug("run %s: the model failed", rec.run_id, exc_info=exc)
            end = partial(_finish, svc, rec, claim, follow_ups, status="error", error=error)
        except Exception as exc:  # anything else is a bug: its traceback is logged
            log.exception("run %s failed", rec.run_id)
            error = f"{type(exc).__name__}: {exc}"
            end = partial(_finish, svc, rec, claim, follow_ups, status="error", error=error)
    if end is not None:
        end()
        return
    try:
        if ends is not None:  # with the results that came in beside it, off the loop
            failed = await ends(Ending(svc, rec, claim, result, follow_ups))
            if failed is not None:
                raise failed
        else:  # its end step off the loop: the loop's runs go on
            await off_loop(lambda: _record_result(svc, rec, claim, result, follow_ups))
    except (StoreUnavailable, RunSteered):
        raise  # the store is away (the lane lease lapses and the sweep runs it again), or
        # the turn goes on
    except Exception as exc:  # the result itself cannot be stored: end the run, never strand it
        log.exception("run %s: its result could not be recorded", rec.run_id)
        error = f"the run's result could not be recorded ({type(exc).__name__}: {exc})"
        _finish(svc, rec, claim, follow_ups, status="error", error=error)


def _end_cancelled(svc: Services, rec: RunRecord, claim: Claim, follow_ups: FollowUps) -> None:
    # The end step clears the cancel request with the run's end. A stale copy (another
    # attempt has the run) leaves the request for that attempt's worker to carry out: its
    # end was refused, the run goes on there.
    _finish(svc, rec, claim, follow_ups, status="cancelled", error=CANCELLED_TEXT, aborted=True)


def _timeout_text(rec: RunRecord) -> str:
    return f"run timed out after {rec.timeout_s:g}s" if rec.timeout_s else "run timed out"


async def _run_agent(
    svc: Services,
    rec: RunRecord,
    claim: Claim,
    deferred: Sequence[ToolReturnPart] | None,
    steering: Steering,
) -> RunResult:
    agent_id = sk.agent_id_of(rec.session_key)
    model_ref = rec.model or svc.config.model_for(agent_id)
    model = resolve_model(model_ref, svc.config.models.providers)
    ctx = _tool_context(svc, rec, claim.session)
    if claim.history is None:
        claim = replace(claim, history=svc.store.transcripts.tail(rec.session_key, HISTORY_LIMIT))
    if claim.entries is not None and not rec.attachments:
        history = model_history(claim.entries)  # read incrementally: model forms kept
    else:
        history = to_model_messages(_with_attachments(rec, _history(claim.history or [])))
    tools = _run_tools(svc, ctx, claim.session)
    client = client_toolset(rec.client_tools, rec.tool_choice)
    if client is not None:  # a request's client-side tools, beside the agent's own
        tools = CombinedToolset([tools, client])
    if deferred is None and rec.tool_results:  # the client's results for the last run's calls
        deferred = tool_returns(rec.tool_results, history)
    if claim.session is None or claim.session.get(CLIENT_CALLS_FIELD):  # it had client calls
        history = answer_left_calls(history)
    result = await run_model_loop(
        model,
        tools=tools,
        ctx=ctx,
        history=history,
        instructions=_instructions(svc, agent_id, rec),
        defer=_parking_metadata,
        tool_results=deferred or (),
        before_tools=lambda: _fence_tools(svc, rec, claim),
        model_settings=tool_settings(rec.tool_choice) if client is not None else None,
        steering=steering,
    )
    telemetry.record_usage(model_ref, result.usage)
    return result


def _run_tools(
    svc: Services, ctx: ToolContext, session: Mapping[str, str] | None
) -> AbstractToolset[ToolRun]:
    """The run's toolset: its session tools, and its MCP and Python tools if any."""
    tools = toolset_for(svc.tools.offered(ctx, session))
    if svc.extra_tools is None:
        return tools
    extra = svc.extra_tools.toolset(lambda names: svc.tools.permitted_external(ctx, names, session))
    return tools if extra is None else CombinedToolset([tools, extra])


def _fence_tools(svc: Services, rec: RunRecord, claim: Claim) -> None:
    """Before a model answer's tool calls run: stop if another attempt has the run. A
    worker cut off from the store past its lease (whose model answered meanwhile) would
    otherwise send, spawn or cancel a second time what the run's new attempt does: the
    check's answer comes after the heal, so it sees the takeover. (A cut landing between
    this check and the tool's own writes still lets them through: tool side effects stay
    at-least-once.)"""
    if not svc.store.runs.is_current(rec.run_id, claim.attempt):
        raise RunSuperseded(rec.run_id)


def _parking_metadata(wait: WaitFor) -> dict[str, Any]:
    """What a parked call keeps: the run it waits on, its deadline, the tool's context."""
    return {
        "targetRunId": wait.target_run_id,
        "alsoRunIds": list(wait.also),
        "deadlineMs": now_ms() + int(wait.timeout_s * 1000),
        "context": wait.context,
    }


def _with_attachments(rec: RunRecord, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A spawned child's attachments join its first message as the model sees it (never
    the transcript)."""
    if not rec.attachments or rec.message is None:
        return msgs
    return with_attachments(msgs, rec.message, rec.attachments)


def _history(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Start at a user message so the model never sees an orphaned tool result.
    for i, m in enumerate(msgs):
        if m.get("role") == "user":
            return msgs[i:]
    return msgs


def _instructions(svc: Services, agent_id: str, rec: RunRecord) -> str | None:
    entry = svc.config.agent(agent_id)
    parts = [
        (entry.system_prompt if entry and entry.system_prompt else None)
        or svc.config.agents.defaults.system_prompt,
        rec.extra_system_prompt,
    ]
    text = "\n\n".join(p for p in parts if p)
    return text or None


def _tool_context(
    svc: Services, rec: RunRecord, session: Mapping[str, str] | None = None
) -> ToolContext:
    agent_id = sk.agent_id_of(rec.session_key)
    is_main = sk.session_kind(rec.session_key, main_key=svc.config.session.main_key) == "main"
    if session is None:
        entry = svc.store.sessions.get(rec.session_key)
        session = entry.fields if entry else {}
    depth = codec.as_int(str(session.get("spawnDepth") or 0)) or 0
    if depth < 1 and sk.is_subagent_key(rec.session_key):
        depth = max(1, rec.session_key.count(":subagent:"))
    return ToolContext(
        services=svc,
        session_key=rec.session_key,
        agent_id=agent_id,
        run_id=rec.run_id,
        channel=rec.channel,
        sandboxed=svc.config.is_sandboxed(agent_id, is_main),
        spawn_depth=depth,
    )


def _record_result(
    svc: Services, rec: RunRecord, claim: Claim, result: RunResult, follow_ups: FollowUps
) -> None:
    pipe = svc.store.pipeline()
    ended = _queue_result(svc, rec, claim, result, follow_ups, pipe)
    if ended is not None:
        ended(pipe.execute())


@dataclass(frozen=True)
class Ending:
    """A run whose result came in, to record (`record_results`), with the context it
    was made in (the run's log fields: its end step logs with them)."""

    svc: Services
    rec: RunRecord
    claim: Claim
    result: RunResult
    follow_ups: FollowUps
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


# The end steps of the runs of one loop whose results came in in the same turn of it,
# recorded in one call off the loop; each run is answered its failure (None: recorded).
EndsTogether = Together[Ending, BaseException | None]


def record_results(endings: list[Ending]) -> list[BaseException | None]:
    """Record the results of runs that came in together: each one's end step queued on
    one pipeline per store (`RunStore.queue_finish`) and sent in one round trip, then
    each one's reply read in turn (`after_run_end`); a run that parks makes its own round
    trips. Each run's part runs in its own context (`Ending.context`). Each run's
    failure is answered in its place: an end step that failed, fails alone; the round
    trip failing fails each one whose end it carried."""
    failed: list[BaseException | None] = [None] * len(endings)
    for store in {id(e.svc.store): e.svc.store for e in endings}.values():
        pipe = store.pipeline()
        queued: list[tuple[int, Callable[[Sequence[Any]], object]]] = []
        for i, e in enumerate(endings):
            if e.svc.store is not store:
                continue
            try:
                ended = e.context.run(
                    _queue_result, e.svc, e.rec, e.claim, e.result, e.follow_ups, pipe
                )
            except Exception as exc:
                failed[i] = exc
                continue
            if ended is not None:
                queued.append((i, ended))
        if not queued:
            continue
        try:
            replies = pipe.execute(raise_on_error=False)  # an end's error is its own
        except Exception as exc:
            for i, _ in queued:
                failed[i] = exc
            continue
        for i, ended in queued:
            try:
                endings[i].context.run(ended, replies)
            except Exception as exc:
                failed[i] = exc
    return failed


def _queue_result(
    svc: Services,
    rec: RunRecord,
    claim: Claim,
    result: RunResult,
    follow_ups: FollowUps,
    pipe: Pipeline,
) -> Callable[[Sequence[Any]], object] | None:
    """The run's end step for its result queued on ``pipe`` (answers what reads its
    reply), or its park made here and now (None)."""
    model_ref = rec.model or svc.config.model_for(sk.agent_id_of(rec.session_key))
    provider, _, model_name = model_ref.partition("/")
    new = result.new_messages()
    reply: str | None = str(result.output)
    run_fields: dict[str, Any] | None = None
    session_fields: dict[str, Any] = {}
    if isinstance(result.output, DeferredToolRequests):
        calls, others = client_calls(result.output)
        if not calls:
            messages = _transcript_of(result, new, model_name, provider)
            _park(svc, rec, claim, result.output, messages, result.steer_taken)
            return None
        # The run ends with the client's calls (status ok), for the client to execute.
        if others:
            new = [*new, ModelRequest(parts=list(others))]
        reply, run_fields = last_text(new), {"toolCalls": [c.to_json() for c in calls]}
        session_fields[CLIENT_CALLS_FIELD] = 1
    messages = _transcript_of(result, new, model_name, provider)
    usage = result.usage
    # A turn a tool ended (sessions_yield) ends ok, marked, with what the model said.
    ended = result.output if isinstance(result.output, TurnEnded) else None
    if ended is not None:
        reply = ended.text
        run_fields = {"yielded": True} if ended.paused else None
    return _queue_finish(
        svc,
        rec,
        claim,
        follow_ups,
        pipe,
        status="ok",
        reply=reply,
        run_fields=run_fields,
        messages=messages,
        steer_taken=result.steer_taken,
        usage={
            "input": usage.input_tokens,
            "output": usage.output_tokens,
            "totalTokens": usage.input_tokens + usage.output_tokens,
        },
        session_fields={
            "model": model_name,
            "modelProvider": provider,
            "contextTokens": usage.input_tokens,
            **session_fields,
            **(ended.session_fields if ended is not None else {}),
        },
        session_incr={
            "inputTokens": usage.input_tokens,
            "outputTokens": usage.output_tokens,
            "totalTokens": usage.input_tokens + usage.output_tokens,
        },
    )


def _transcript_of(
    result: RunResult, new: list[ModelMessage], model_name: str, provider: str
) -> list[dict[str, Any]]:
    """The run's new messages as transcript entries; steered ones as they were sent
    (content and provenance), not as the model was shown them."""
    messages = to_transcript(new, model=model_name, provider=provider)
    return restore_steered(messages, result.steered) if result.steered else messages


def _park(
    svc: Services,
    rec: RunRecord,
    claim: Claim,
    requests: DeferredToolRequests,
    messages: Sequence[Mapping[str, Any]],
    steer_taken: int,
) -> None:
    calls = []
    for part in requests.calls:
        meta = requests.metadata.get(part.tool_call_id, {})
        calls.append(
            ParkedCall(
                tool_call_id=part.tool_call_id,
                tool_name=part.tool_name,
                target_run_id=str(meta.get("targetRunId", "")),
                deadline_ms=int(meta.get("deadlineMs", now_ms())),
                context=meta.get("context") or {},
                also_run_ids=tuple(str(r) for r in meta.get("alsoRunIds") or ()),
            )
        )
    verdict = svc.store.runs.park(
        rec.run_id,
        rec.session_key,
        claim.attempt,
        calls=calls,
        messages=messages,
        steer_taken=steer_taken,
    )
    if verdict == "stale":
        _log_fenced(rec, claim, "park")
    else:
        log.info("run %s parked on %d call(s): %s", rec.run_id, len(calls), verdict)
    if verdict != "stale":
        parked = run_event(rec, waitsOn=[c.target_run_id for c in calls])
        svc.store.events.publish("run.parked", parked)
    # A wait on several runs parks while one is pending; one that ended before it was
    # parked answers it now (the resume checks).
    if verdict == "ready" or (verdict == "parked" and any(c.also_run_ids for c in calls)):
        svc.queue.enqueue_resume(rec.run_id, rec.session_key)


class _EndFields(TypedDict, total=False):
    """What a run's end records beside its status (`_finish`)."""

    reply: str | None
    error: str | None
    messages: Sequence[Mapping[str, Any]]
    usage: Mapping[str, Any] | None
    session_fields: Mapping[str, Any] | None
    session_incr: Mapping[str, int] | None
    aborted: bool
    run_fields: Mapping[str, Any] | None
    steer_taken: int


def _finish(
    svc: Services,
    rec: RunRecord,
    claim: Claim,
    follow_ups: FollowUps,
    *,
    status: str,
    **end: Unpack[_EndFields],
) -> bool:
    """End the run (its end step); False when the attempt fence refused it."""
    pipe = svc.store.pipeline()
    ended = _queue_finish(svc, rec, claim, follow_ups, pipe, status=status, **end)
    return ended(pipe.execute(raise_on_error=False))


def _queue_finish(
    svc: Services,
    rec: RunRecord,
    claim: Claim,
    follow_ups: FollowUps,
    pipe: Pipeline,
    *,
    status: str,
    **end: Unpack[_EndFields],
) -> Callable[[Sequence[Any]], bool]:
    """`_finish` queued on ``pipe``: answers what reads its reply once the caller
    executed it (False when the attempt fence refused the end)."""
    reply, error, messages = end.get("reply"), end.get("error"), end.get("messages", ())
    fields = {"abortedLastRun": end.get("aborted", False), **(end.get("session_fields") or {})}
    # The run.ended event is written by the end step itself (only when it applies).
    event = run_event(rec, status=status, reply=reply, error=error, messages=len(messages))
    read = svc.store.runs.queue_finish(
        pipe,
        rec.run_id,
        rec.session_key,
        claim.attempt,
        RunEnd(
            status=status,
            messages=messages,
            reply=reply,
            error=error,
            usage=end.get("usage"),
            session_fields=fields,
            session_incr=end.get("session_incr"),
            event=("run.ended", {**event, "ts": now_ms()}, EVENTS_MAXLEN),
            follow_up_reads=_follow_up_reads(svc, rec),
            run_fields=end.get("run_fields"),
            steer_taken=end.get("steer_taken", 0),
        ),
    )

    def ended(replies: Sequence[Any]) -> bool:
        res = read(replies)
        if res.steered is not None:
            raise RunSteered(res.steered)
        if not res.applied:
            _log_fenced(rec, claim, f"end ({status})")
            return False
        log.info("run %s ended: %s", rec.run_id, status, extra={"status": status, "error": error})
        svc.metrics.run_ended(status, res.run)
        svc.watch.ended(status, res.run)
        after_run_end(
            svc, rec.run_id, res.next_run_id, res.waiters, ended=res.run, follow_ups=follow_ups
        )
        return True

    return ended


def _log_fenced(rec: RunRecord, claim: Claim, write: str) -> None:
    """A write of this run refused by its attempt fence (another attempt has the run, or
    it ended meanwhile): logged once per refusal, as every fenced write is (`FENCED`)."""
    log.warning(
        "%s run %s attempt %d: %s refused (superseded attempt, not applied)",
        FENCED,
        rec.run_id,
        claim.attempt,
        write,
        extra={"runId": rec.run_id, "fenced": write.split(" ", 1)[0]},
    )


def _follow_up_reads(svc: Services, rec: RunRecord) -> str | None:
    """The hash a run's follow-up step reads first, read in its end step: the flow of a
    run in a reply-back flow, the spawn of a sub-agent's run (its announce step); the
    step also takes the run's session, read there too."""
    if not rec.on_end:
        return None
    flow_id, spawn_id = rec.meta.get("flowId"), rec.meta.get("spawnId")
    if flow_id:
        return svc.store.ks.flow(str(flow_id))
    return svc.store.ks.spawn(str(spawn_id)) if spawn_id else None


def after_run_end(
    svc: Services,
    run_id: str,
    next_run_id: str | None,
    waiters: Sequence[str],
    *,
    ended: RunRecord | None = None,
    follow_ups: FollowUps = None,
) -> None:
    """Start the lane's next run, resume parked waiters, enqueue the run's follow-up step
    (or collect the run in ``follow_ups``) and run the end-of-run hooks.

    ``ended`` is the run as its end step stored it (read again when not given)."""
    if ended is None:
        ended = svc.store.runs.get(run_id)
    if next_run_id and ended is not None:
        svc.queue.enqueue_run(next_run_id, ended.session_key)
    for waiter in svc.store.runs.get_many(list(waiters)):
        if waiter is not None and waiter.status == "parked":
            svc.queue.enqueue_resume(waiter.run_id, waiter.session_key)
    if ended is None:
        return
    if ended.on_end:
        if follow_ups is None:
            enqueue_follow_up(svc, ended)
        else:
            follow_ups.append(ended)  # run by the caller once the run is done with
    for hook in svc.on_run_end:
        try:
            hook(svc, ended)
        except Exception:
            log.exception("end-of-run hook %s failed for run %s", hook, run_id)


def enqueue_follow_up(svc: Services, rec: RunRecord) -> None:
    """Enqueue a run's `onEnd` step and clear it from the outbox (the sweep retries it)."""
    assert rec.on_end is not None
    svc.queue.enqueue(str(rec.on_end["task"]), *[str(a) for a in rec.on_end.get("args", [])])
    svc.store.runs.outbox_done(rec.run_id)
