"""A run's follow-up steps, run in the task that ran the run (the worker's inline execution).

The coroutine that ran a run runs its follow-up step in place (a reply-back round, an
announce), and the runs that step starts, up to `RUNS_TAKEN_HERE` (`then_follow_up`); the
rest are messages. A follow-up step enqueued on its own (by the sweep, or a step not ready
yet) is a message of its own. The runs of a loop that end in the same turn of it share their
end steps' round trip and run their follow-ups in one call (`Waves`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.flows.steps import run_follow_ups
from switchboard.shared.queue import RunsTakenHere
from switchboard.shared.runtime.executor import (
    HISTORY_LIMIT,
    EndsTogether,
    execute_run,
    resume_run,
)
from switchboard.shared.runtime.off_loop import off_loop
from switchboard.shared.runtime.together import Together
from switchboard.shared.services import Services
from switchboard.shared.store.runs import Claim, RunRecord
from switchboard.workers.run_host import Claimed, Claims

log = logging.getLogger("switchboard.worker")

# How many runs started by a task's follow-up steps (an announce run, a reply-back round)
# the task executes itself; past that they go out as messages, so one task never keeps a
# long chain of rounds to itself.
RUNS_TAKEN_HERE = 4

# A run to execute (`execute_run` or `resume_run` with its ids bound), given where to
# collect the runs it ends that have a follow-up step (None: enqueue those steps).
RunStart = Callable[[list[RunRecord] | None], Awaitable[None]]


async def run_and_follow_up(
    svc: Services, start: RunStart, claimed: Claimed, waves: Waves | None = None
) -> None:
    """Execute a run, then its follow-up step right here (`then_follow_up`, with the
    follow-ups of runs ending at the same time when ``waves`` is given; ``start`` was
    given them for its end step). ``claimed`` is told once the run was claimed (by the
    executor), or as the run ends or fails before that."""
    try:
        await then_follow_up(svc, start, waves)
    except BaseException as exc:
        claimed(exc)  # nothing if the run was claimed: it went on past its message
        raise
    finally:
        claimed(None)


async def then_follow_up(svc: Services, start: RunStart, waves: Waves | None = None) -> None:
    """Execute a run (``start``), then its follow-up step right away (off the loop,
    `off_loop`: its store round trips do not hold up the loop's other runs), then the
    runs its follow-up started (up to `RUNS_TAKEN_HERE`), each with its own follow-up;
    the followed runs' outbox entries are cleared together at the end. With
    ``waves``, the end steps of the loop's runs whose results came in in the same turn of
    the loop go in one round trip, and their follow-ups run in one call (`Waves`).

    Handing the ended run back to the pool thread for its follow-up cost a wake-up across
    threads per run: with a batch in flight, the loop running the follow-up measured about
    a tenth faster. A `sessions_send` starts its announce run from its follow-up: executed
    here, it costs no message of its own (two fewer per send, with its announce step)."""
    here = RunsTakenHere(
        svc.queue, RUNS_TAKEN_HERE, history=HISTORY_LIMIT, requeue=svc.store.runs.requeue
    )
    followed: list[str] = []  # runs whose outbox entries are cleared at the end, together
    try:
        ended_runs: list[RunRecord] = []
        await start(ended_runs)
        while True:
            # Only the follow-ups are handed `here`, never a run: a run's own children
            # must not wait for it to end.
            if ended_runs:
                asked = _FollowUps(svc, ended_runs, here, followed)
                if waves is None:
                    followed = (await off_loop(partial(follow_up_together, [asked])))[0]
                else:
                    followed = await waves.follow_ups(asked)
            if not here.runs:
                return
            run_id, session_key = here.runs[0]
            claim = here.claims.pop(run_id, None)  # claimed as it started: no claim step
            ended_runs = []
            await execute_run(
                svc,
                run_id,
                session_key,
                claim=claim,
                follow_ups=ended_runs,
                ends=waves.ends if waves is not None else None,
            )
            here.runs.popleft()
    finally:
        here.release()
        clear_outbox(svc, followed)


@dataclass(frozen=True)
class _FollowUps:
    """The ended runs of one `then_follow_up` whose follow-up steps are to run: where
    the runs their steps start are taken (``here``), and the runs followed up before whose
    outbox entries are still to be cleared."""

    svc: Services
    ended: list[RunRecord]
    here: RunsTakenHere
    followed: list[str]
    # The context it was made in (the run's log fields): its steps run in it.
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


# The follow-ups of the runs of a run loop that end in the same turn of it, run together.
FollowUpsTogether = Together["_FollowUps", list[str]]


@dataclass(frozen=True)
class Waves:
    """What the runs of a loop that end in the same turn of it share (kept by the
    `RunHost`): one round trip for their end steps (`record_results`)
    and one call for their follow-ups (`follow_up_together`)."""

    ends: EndsTogether
    follow_ups: FollowUpsTogether


def follow_up_together(asked: list[_FollowUps]) -> list[list[str]]:
    """The follow-up steps of the runs of each ``asked`` (`steps.run_follow_ups`: of a
    step with a form for many, one call for all); answers, per ``asked``, the runs whose
    outbox entries are still to be cleared: its ``followed`` and its ended runs, or none
    once cleared here (when its steps started no run to take in its task, that task ends:
    cleared in the same go)."""
    cleared: dict[int, list[bool]] = {}
    for svc in {id(a.svc): a.svc for a in asked}.values():
        mine = [i for i, a in enumerate(asked) if a.svc is svc]
        flat = [(rec, asked[i].here) for i in mine for rec in asked[i].ended]
        contexts = [asked[i].context for i in mine for _ in asked[i].ended]
        answers = iter(run_follow_ups(svc, flat, contexts))
        for i in mine:
            cleared[i] = [next(answers) for _ in asked[i].ended]
    left_of: list[list[str]] = []
    for i, a in enumerate(asked):
        left = a.followed + [rec.run_id for rec, c in zip(a.ended, cleared[i], strict=True) if c]
        if a.here.runs:
            left_of.append(left)
        else:
            clear_outbox(a.svc, left)
            left_of.append([])
    return left_of


def executing(
    svc: Services,
    run_id: str,
    session_key: str,
    claimed: Claimed,
    claim: Claim | str | None = None,
    waves: Waves | None = None,
) -> RunStart:
    """The `RunStart` of a queued run (``claim``: as its message's claims answered)."""
    ends = waves.ends if waves is not None else None
    return lambda follow_ups: execute_run(
        svc,
        run_id,
        session_key,
        claim=claim,
        follow_ups=follow_ups,
        on_claimed=claimed,
        ends=ends,
    )


def resuming(svc: Services, run_id: str, claimed: Claimed, waves: Waves | None = None) -> RunStart:
    """The `RunStart` of a parked run to continue."""
    ends = waves.ends if waves is not None else None
    return lambda follow_ups: resume_run(
        svc, run_id, follow_ups=follow_ups, on_claimed=claimed, ends=ends
    )


def clear_outbox(svc: Services, run_ids: list[str]) -> None:
    """Clear followed-up runs from the outbox, in one round trip; if the store is away,
    the sweep finds them there and runs their (idempotent) steps again."""
    if not run_ids:
        return
    try:
        svc.store.runs.outbox_done(*run_ids)
    except StoreUnavailable as exc:
        log.warning(
            "outbox entries of %d run(s) left to the sweep: %s", len(run_ids), exc.__cause__
        )


async def run_together(
    svc: Services, pairs: list[list[str]], claims: Claims, waves: Waves | None = None
) -> None:
    """Execute runs side by side on one loop (one hand-over from the pool thread for the
    message, not one per run); if any failed, raise the first failure once all have ended."""
    claimed = [claims.run() for _ in pairs]
    outcomes = await asyncio.gather(
        *(
            run_and_follow_up(svc, executing(svc, rid, key, told, waves=waves), told, waves)
            for (rid, key), told in zip(pairs, claimed, strict=True)
        ),
        return_exceptions=True,
    )
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        raise failed
