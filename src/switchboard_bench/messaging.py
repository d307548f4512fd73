"""Scenarios around `sessions_send`: send+wait latency and throughput (parked waits: `parked`).

Sends go through `POST /tools/invoke` (or, for parked waits, from inside agent runs) to
target sessions whose model answers at once: `builtin/echo` (agent `main`), and the path a
deployment runs, the fake OpenAI-compatible server over HTTP through the OpenAI client
(agent `http`); latency also through that server answering after `SLOW_MODEL_MS` (agent
`slow`: what the product adds to a model with real latency). The reply-back loop is off
(`maxPingPongTurns: 0`) so a measurement is one send and its announce, not five extra
ping-pong runs; every send still runs its announce step. Latency and throughput are
measured beside two anchors (`anchor.shapes`) and judged against the faster one, through
echo and through the HTTP model alike.

Latency samples are taken in blocks of back-to-back calls, the way a user's loop makes
them, not one call after an idle pause: on this kind of machine (a VM whose idle vCPUs halt)
a round trip after a pause of a few milliseconds took twice as long (a plain no-op
`.delay().get()`: 2.3 ms back to back, 4.5-5 ms with 20 ms pauses or with the settling poll
between samples), which measured the machine's wake-up rather than Celery or the product.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import httpx
import orjson
from celery import Celery
from rich.progress import Progress

from switchboard_bench.anchor import NOOP, AnchorShape
from switchboard_bench.command_steps import step_costs
from switchboard_bench.costs import CostMeter, Costs
from switchboard_bench.harness import (
    ONE_AGENT_STACK,
    WORKER_CONCURRENCY,
    BenchRun,
    Stack,
    phase,
)
from switchboard_bench.report import Outcome, latency_summary, ratio
from switchboard_testkit.bulk import BulkLoader

REQUESTER = "agent:main:main"
# The agents whose model is the fake OpenAI-compatible server: answering at once, and after
# SLOW_MODEL_MS (a model with real latency).
HTTP_AGENT, SLOW_AGENT = "http", "slow"
SLOW_MODEL_MS = 100.0
LONG_SESSION = "agent:main:bench:long"
LONG_MESSAGES = 1000
# The long session's target: a send+wait there costs at most this many times a fresh one's
# (history is read incrementally, `store.windows`, so its length should cost nothing).
LONG_TO_FRESH = 1.2
PRODUCT = ("api", "worker0", "redis")  # the processes whose CPU a product run costs
_CONCURRENCY = WORKER_CONCURRENCY
_WARM_UP = 10
_BLOCK = 50  # back-to-back latency samples per block
# Untimed calls that open a block: the first few calls after a pause ran slower (the
# prefork anchor's first five 4.4-3.5 ms, then 3.2 ms), on every side.
_LEAD_IN = 3
# How often completion is polled while a burst runs. Figures come from the end times
# recorded in Redis (run `endedAt`, task `date_done`), not from when a poll saw them, so
# polling less often changes no figure; it only takes less CPU from the stack under test
# (a poll of 500 pending runs every 50 ms cost the bench process half a core).
_POLL_S = 0.25


def messaging_stack(run: BenchRun, name: str) -> Stack:
    """The one-agent stack with the HTTP-model agents beside `main` (their model servers
    started for the run)."""
    fake = {"apiKey": "bench", "api": "openai-completions"}
    config = {
        **ONE_AGENT_STACK["config"],
        "models": {
            "providers": {
                "fake": {**fake, "baseUrl": run.stacks.model_server(0)},
                "slow": {**fake, "baseUrl": run.stacks.model_server(SLOW_MODEL_MS)},
            }
        },
        "agents": {
            "list": [
                {"id": "main", "default": True},
                {"id": HTTP_AGENT, "model": "fake/fake-model"},
                {"id": SLOW_AGENT, "model": "slow/fake-model"},
            ]
        },
    }
    return run.stacks.get(name, **{**ONE_AGENT_STACK, "config": config})


def latency(run: BenchRun) -> Outcome:
    """p50/p99 of a waiting `sessions_send` over HTTP, into fresh sessions (echo, the HTTP
    model, the HTTP model with real latency) and into one holding a thousand messages, vs a
    no-op Celery `.delay().get()` on each anchor."""
    st = messaging_stack(run, "latency")
    n, cost_n = (40, 10) if run.quick else (300, 50)
    apps = st.anchor_apps()
    with phase(run.progress, "latency: warm up"):
        st.warm_up()
        st.warm_up_anchors(apps)
    bad: list[dict[str, Any]] = []
    stamps: list[Stamp] = []
    with st.http() as http:
        steps = _latency_steps(st, http, apps, bad, stamps)
        for i in range(_WARM_UP):
            for step in steps.values():
                step(-1 - i)
        with phase(run.progress, f"latency: load a session to {LONG_MESSAGES:,} messages"):
            # The warm-up sends' follow-ups (reply-back rounds) still append to the long
            # session: the bulk load numbers its messages after what is there, so wait.
            st.wait_idle()
            held = _hold_messages(st, LONG_SESSION, LONG_MESSAGES)
        samples = _in_blocks(st, run.progress, steps, n)
        phases = _phases(st, stamps)
        costs = _round_trip_costs(st, run.progress, steps, cost_n)
    return _latency_outcome(st, samples, costs, n=n, held=held, bad=bad, phases=phases)


# A timed send: (wall-clock ms at its start, at its answer, its run id).
Stamp = tuple[float, float, str]


def _phases(st: Stack, stamps: Sequence[Stamp]) -> dict[str, Any]:
    """Where a send+wait into a fresh session spends its time: the means over the timed
    sends of the legs between the times its run record holds (taken on this machine's
    clock, in whole ms, just before the step that writes them: `createdAt` before the
    submit script, `startedAt` before the claim, `endedAt` before the end script)."""
    runs = st.store().runs.get_many([run_id for _, _, run_id in stamps])
    legs: dict[str, list[float]] = {
        "toRecordedMs": [],
        "recordedToClaimedMs": [],
        "claimedToEndedMs": [],
        "endedToAnswerMs": [],
    }
    for (start_ms, answer_ms, _), rec in zip(stamps, runs, strict=True):
        if rec is None or not (rec.created_at_ms and rec.started_at_ms and rec.ended_at_ms):
            continue
        legs["toRecordedMs"].append(rec.created_at_ms - start_ms)
        legs["recordedToClaimedMs"].append(rec.started_at_ms - rec.created_at_ms)
        legs["claimedToEndedMs"].append(rec.ended_at_ms - rec.started_at_ms)
        legs["endedToAnswerMs"].append(answer_ms - rec.ended_at_ms)
    out: dict[str, Any] = {"n": len(legs["toRecordedMs"])}
    for name, values in legs.items():
        out[name] = round(sum(values) / len(values), 2) if values else None
    out["what"] = (
        "means per send+wait into a fresh session: client to run recorded (HTTP in, the "
        "tool, the submit script), recorded to claimed (the Celery message, the worker's "
        "receive, the claim script), claimed to ended (the agent run), ended to answer "
        "(the end script, its publish, the api's answer); run times are whole ms"
    )
    return out


def _latency_steps(
    st: Stack,
    http: httpx.Client,
    apps: Mapping[str, Celery],
    bad: list[dict[str, Any]],
    stamps: list[Stamp] | None = None,
) -> dict[str, Callable[[int], None]]:
    """One timed step per figure: a send into a fresh session, into the long one, and a
    no-op round trip on each anchor. Each timed send into a fresh session (``i`` ≥ 0)
    leaves its wall-clock start and end and its run id in ``stamps`` (`_phases`)."""

    def send(target: Callable[[int], str], i: int, requester: str = REQUESTER) -> None:
        start_ms = time.time() * 1000
        result = st.tool(
            http,
            "sessions_send",
            requester,
            sessionKey=target(i),
            message="ping",
            timeoutSeconds=30,
        )
        if result.get("status") != "ok" or result.get("reply") != "ping":
            bad.append(result)
        elif stamps is not None and i >= 0 and target(i).startswith("agent:main:bench:lat-"):
            stamps.append((start_ms, time.time() * 1000, str(result["runId"])))

    def roundtrip(app: Celery, _i: int) -> None:
        app.tasks[NOOP].delay().get(timeout=30)

    steps: dict[str, Callable[[int], None]] = {
        "fresh": partial(send, lambda i: f"agent:main:bench:lat-{i}"),
        "long": partial(send, lambda _i: LONG_SESSION),
    }
    for name, agent in (("http", HTTP_AGENT), ("slow", SLOW_AGENT)):
        target = partial("agent:{}:bench:lat-{}".format, agent)
        steps[name] = partial(send, target, requester=f"agent:{agent}:main")
    for shape in st.anchors():
        steps[shape.name] = partial(roundtrip, apps[shape.name])
    return steps


def _hold_messages(st: Stack, key: str, count: int) -> int:
    """Grow ``key``'s transcript to ``count`` messages with the testkit's bulk loader
    (copies of the messages real sends wrote there); the length it has now."""
    store = st.store()
    bulk = BulkLoader(store.redis, store.ks)
    bulk.extend_transcript(key, bulk.transcript_payloads(key), count, advance=lambda _n: None)
    return store.transcripts.length(key)


def _in_blocks(
    st: Stack, progress: Progress, steps: Mapping[str, Callable[[int], None]], n: int
) -> dict[str, list[float]]:
    """n samples (ms) of every step, in blocks of back-to-back calls (a user's loop), the
    steps' blocks alternated A/B/A/B in a rotating order so all see the same noise.

    Every side is timed the same way: within a block a send's announce runs while the next
    send is in flight, as in any loop of sends. Each block starts on a settled stack (the
    last block's follow-ups done) with a few untimed calls, which pay the wake-up after
    the pause that no later call in the block pays."""
    names = list(steps)
    samples: dict[str, list[float]] = {name: [] for name in names}
    task = progress.add_task(f"latency: {' / '.join(names)} (in blocks)", total=n)
    for block, start in enumerate(range(0, n, _BLOCK)):
        k = block % len(names)
        for name in names[k:] + names[:k]:
            st.settle()
            for j in range(_LEAD_IN):  # the untimed lead-in, each into its own fresh session
                steps[name](-1_000 - block * _LEAD_IN - j)
            for i in range(start, min(start + _BLOCK, n)):
                samples[name].append(_time_ms(partial(steps[name], i)))
        progress.update(task, completed=min(start + _BLOCK, n))
    progress.remove_task(task)
    return samples


def _round_trip_costs(
    st: Stack, progress: Progress, steps: Mapping[str, Callable[[int], None]], n: int
) -> dict[str, Any]:
    """Redis commands and CPU per send+wait (follow-ups included) and per anchor round trip,
    each measured on its own (the interleaved samples share the server's counters)."""
    out: dict[str, Any] = {}
    with phase(progress, f"latency: cost of {n} send+waits and of {n} no-op round trips"):
        st.wait_idle()
        costs = Costs()
        with CostMeter(st, PRODUCT).measure(costs):
            for i in range(n):
                steps["fresh"](100_000 + i)
            st.wait_idle()
        out["sendWait"] = costs.summary(n, unit="send+wait into a fresh session")
        if st.cluster is None:  # which step runs them: a few more sends, watched
            out["sendWait"]["steps"] = step_costs(st, lambda i: steps["fresh"](200_000 + i))
        for shape in st.anchors():
            costs = Costs()
            with CostMeter(st, (shape.process, "redis")).measure(costs):
                for i in range(n):
                    steps[shape.name](i)
            out[f"anchor.{shape.name}"] = costs.summary(n, unit="no-op .delay().get()")
    return out


def _latency_outcome(
    st: Stack,
    samples: Mapping[str, list[float]],
    costs: dict[str, Any],
    *,
    n: int,
    held: int,
    bad: list[dict[str, Any]],
    phases: dict[str, Any],
) -> Outcome:
    fresh, long = latency_summary(samples["fresh"]), latency_summary(samples["long"])
    http, slow = latency_summary(samples["http"]), latency_summary(samples["slow"])
    anchors = {s.name: latency_summary(samples[s.name]) for s in st.anchors()}
    winner = min(anchors, key=lambda name: anchors[name]["p50_ms"])
    best = anchors[winner]
    r = ratio(fresh["p50_ms"], best["p50_ms"])
    http_ratio = ratio(http["p50_ms"], best["p50_ms"])
    long_ratio = ratio(long["p50_ms"], fresh["p50_ms"])
    figure: dict[str, Any] = {
        **fresh,
        "longSession": {
            **long,
            "messagesBefore": held,
            "ratioToFresh": long_ratio,
            "ratioToAnchor": ratio(long["p50_ms"], best["p50_ms"]),
            "target": f"p50 ≤ {LONG_TO_FRESH:g}x fresh",
            "passed": long_ratio <= LONG_TO_FRESH,
        },
        "httpModel": {
            **http,
            "ratioToAnchor": http_ratio,
            "what": "a fresh session whose model is the fake OpenAI-compatible server "
            "(answering at once), through the OpenAI client over HTTP",
            "target": "p50 ≤ 3x the faster anchor's p50",
            "passed": http_ratio <= 3,
        },
        "slowModel": {
            **slow,
            "modelLatencyMs": SLOW_MODEL_MS,
            "overheadP50Ms": round(slow["p50_ms"] - SLOW_MODEL_MS, 2),
            "what": f"the same server answering after {SLOW_MODEL_MS:g} ms: p50 less the "
            "model's own time is what the product adds to a model with real latency",
        },
        "phases": phases,
    }
    return Outcome(
        scenario="latency",
        title="send+wait latency",
        figure=figure,
        anchor={
            "what": "no-op Celery task .delay().get() on the same Redis, the faster anchor",
            "fasterAnchor": winner,
            **best,
            **_anchor_details(st.anchors(), anchors),
        },
        ratio=r,
        ratio_text="p50 / faster anchor p50",
        target=f"p50 ≤ 3x the faster anchor's p50 (echo and HTTP model); {LONG_MESSAGES:,} "
        f"msgs held ≤ {LONG_TO_FRESH:g}x fresh",
        passed=r <= 3 and http_ratio <= 3 and long_ratio <= LONG_TO_FRESH,
        figure_text=(
            f"p50 {fresh['p50_ms']:.1f} ms, p99 {fresh['p99_ms']:.1f} ms; "
            f"HTTP model p50 {http['p50_ms']:.1f} ms ({http_ratio:.2f}x); "
            f"{SLOW_MODEL_MS:g} ms model p50 {slow['p50_ms']:.1f} ms "
            f"(+{figure['slowModel']['overheadP50Ms']:.1f}); "
            f"{held:,} msgs held: p50 {long['p50_ms']:.1f} ms "
            f"({figure['longSession']['ratioToFresh']:.2f}x fresh)"
        ),
        anchor_text=_anchors_text(anchors, winner, "p50_ms", "p50 {:.1f} ms"),
        parameters={
            "sends": n,
            "path": "POST /tools/invoke sessions_send timeoutSeconds=30",
            "model": "builtin/echo; httpModel: fake/fake-model over HTTP (0 ms); slowModel: "
            f"the same server at {SLOW_MODEL_MS:g} ms",
            "maxPingPongTurns": 0,
            "workerConcurrency": _CONCURRENCY,
            "anchors": {s.name: s.what for s in st.anchors()},
            "targets": f"a fresh session per send; and one session ({LONG_SESSION}) "
            f"bulk-loaded to {LONG_MESSAGES:,} messages, growing by each send",
            "order": f"blocks of {_BLOCK} back-to-back calls per side (a user's loop), "
            "alternated in a rotating order; each block starts once no work is queued, in "
            f"flight or active, with {_LEAD_IN} untimed calls",
            "costSamples": costs["sendWait"].get("units", 0),
        },
        checks={"allOk": not bad},
        costs=costs,
        notes=[f"{len(bad)} send(s) did not answer ok: {bad[:3]}"] if bad else [],
    )


def _anchor_details(
    shapes: Sequence[AnchorShape], figures: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    return {s.name: {"what": s.what, **figures[s.name]} for s in shapes}


def _anchors_text(
    figures: Mapping[str, Mapping[str, Any]], winner: str, field: str, fmt: str
) -> str:
    """The faster anchor first, the other beside it: ``p50 1.4 ms prefork (threads p50 2.1 ms)``."""
    others = ", ".join(
        f"{name} {fmt.format(f[field])}" for name, f in figures.items() if name != winner
    )
    return f"{fmt.format(figures[winner][field])} {winner}" + (f" ({others})" if others else "")


def _time_ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


# -- throughput -------------------------------------------------------------------------


def throughput(run: BenchRun) -> Outcome:
    """Fire-and-forget sends completed per second vs no-op Celery tasks per second.

    Five rounds of a thousand each, product then each anchor back to back, medians
    compared: a round of 500 lasted about three seconds, a sixth of which is the pipeline
    filling (nothing ends until the first runs have crossed api, broker and worker) and
    the last runs draining, so it measured the ramp as much as the rate; and on a shared
    machine single rounds of either side range widely (the anchor 319-435 tasks/s in one
    run, the product's ratio 0.42-0.62 over nine rounds of the same code), so the median
    of five moves less than that of three. Every round is also metered: Redis commands
    and CPU seconds (api + worker + Redis) from the first send until its follow-ups end."""
    n, rounds = (150, 1) if run.quick else (1000, 5)
    progress = run.progress
    st = messaging_stack(run, "throughput")
    apps = st.anchor_apps()
    with phase(progress, "throughput: warm up"):
        st.warm_up()
        st.warm_up_anchors(apps)
        st.wait_idle()
    shapes = st.anchors()
    ours: list[float] = []
    http: list[float] = []
    base: dict[str, list[float]] = {s.name: [] for s in shapes}
    costs = {"product": Costs(), **{s.name: Costs() for s in shapes}}
    completed = http_completed = 0
    for round_no in range(rounds):
        label = f"throughput round {round_no + 1}/{rounds}"
        with CostMeter(st, PRODUCT).measure(costs["product"]):
            rate, ok = _product_rate(st, progress, n, f"{label}: sends", tag=str(round_no))
            with phase(progress, f"{label}: wait for follow-ups (announces) to drain"):
                st.wait_idle()
        ours.append(rate)
        completed += ok
        rate, ok = _product_rate(
            st, progress, n, f"{label}: sends, HTTP model", tag=str(round_no), agent=HTTP_AGENT
        )
        with phase(progress, f"{label}: wait for follow-ups (announces) to drain"):
            st.wait_idle()
        http.append(rate)
        http_completed += ok
        k = round_no % len(shapes)
        for shape in shapes[k:] + shapes[:k]:  # neither anchor always runs right after us
            with CostMeter(st, (shape.process, "redis")).measure(costs[shape.name]):
                rate = _anchor_rate(st, apps[shape.name], progress, n, f"{label}: {shape.process}")
            base[shape.name].append(rate)
    outcome = _throughput_outcome(st, ours, base, costs, n=n, rounds=rounds, completed=completed)
    _add_http_throughput(outcome, http, n=n, rounds=rounds, completed=http_completed)
    return outcome


def _add_http_throughput(
    outcome: Outcome, rates: Sequence[float], *, n: int, rounds: int, completed: int
) -> None:
    """The same rounds with the HTTP model (agent `http`), beside echo's, judged alike."""
    rate = round(_median(rates), 1)
    r = ratio(rate, float(outcome.anchor["tasksPerS"]))
    outcome.figure["httpModel"] = {
        "sendsPerS": rate,
        "rounds": [round(x, 1) for x in rates],
        "ratioToAnchor": r,
        "what": "the same sends into sessions whose model is the fake OpenAI-compatible "
        "server (answering at once), through the OpenAI client over HTTP",
        "passed": r >= 0.5,
    }
    outcome.passed = outcome.passed and r >= 0.5
    outcome.figure_text += f"; HTTP model {rate:.0f} sends/s ({r:.2f}x)"
    outcome.checks["httpModelAllCompleted"] = completed == n * rounds
    if completed < n * rounds:
        outcome.notes.append(f"{n * rounds - completed} HTTP-model send(s) did not complete ok")


def _throughput_outcome(
    st: Stack,
    ours: Sequence[float],
    base: Mapping[str, Sequence[float]],
    costs: Mapping[str, Costs],
    *,
    n: int,
    rounds: int,
    completed: int,
) -> Outcome:
    rate = round(_median(ours), 1)
    medians = {name: round(_median(r), 1) for name, r in base.items()}
    anchors: dict[str, dict[str, Any]] = {
        name: {"tasksPerS": medians[name], "rounds": [round(x, 1) for x in r]}
        for name, r in base.items()
    }
    winner = max(medians, key=lambda name: medians[name])
    anchor_rate = medians[winner]
    r = ratio(rate, anchor_rate)
    incomplete = n * rounds - completed
    run_costs = {
        "fireAndForget": costs["product"].summary(completed, unit="completed fire-and-forget run"),
        **{
            f"anchor.{name}": costs[name].summary(n * rounds, unit="no-op task") for name in anchors
        },
    }
    return Outcome(
        scenario="throughput",
        title="throughput",
        figure={"sendsPerS": rate, "rounds": [round(x, 1) for x in ours]},
        anchor={
            "what": "no-op Celery tasks completed per second on the same Redis, the faster anchor",
            "fasterAnchor": winner,
            **anchors[winner],
            **_anchor_details(st.anchors(), anchors),
        },
        ratio=r,
        ratio_text="sends/s / faster anchor tasks/s",
        target="≥ 50% of the faster anchor",
        passed=r >= 0.5,
        figure_text=f"{rate:.0f} sends/s ({r:.2f}x)",
        anchor_text=_anchors_text(anchors, winner, "tasksPerS", "{:.0f} tasks/s"),
        parameters={
            "sendsPerRound": n,
            "rounds": rounds,
            "path": "POST /tools/invoke sessions_send timeoutSeconds=0, 32 requests in flight",
            "completion": "target run status terminal in Redis (transcript written)",
            "model": "builtin/echo; httpModel: fake/fake-model over HTTP (0 ms)",
            "maxPingPongTurns": 0,
            "workerConcurrency": _CONCURRENCY,
            "anchors": {s.name: s.what for s in st.anchors()},
            "workers": 1,
            "costs": "INFO commandstats and /proc CPU (user+sys of api, worker0, redis and "
            "their children) from the first send until follow-ups drained; the bench's own "
            "polling commands left out, idle background included",
        },
        checks={"allCompleted": incomplete == 0},
        costs=run_costs,
        notes=[f"{incomplete} send(s) did not complete ok"] if incomplete else [],
    )


def _product_rate(
    st: Stack, progress: Progress, n: int, label: str, *, tag: str, agent: str = "main"
) -> tuple[float, int]:
    """Sends per second from the first request to the last target run's end, within
    ``agent``'s sessions; (rate, the sends completed ok with their transcript written)."""
    task = progress.add_task(label, total=n)
    t0_ms = time.time() * 1000
    targets = [f"agent:{agent}:bench:tp-{tag}-{i}" for i in range(n)]
    requester = f"agent:{agent}:main"

    async def fire() -> list[str]:
        async with st.async_http() as http:
            gate = asyncio.Semaphore(32)

            async def one(target: str) -> str:
                body = {
                    "tool": "sessions_send",
                    "sessionKey": requester,
                    "args": {"sessionKey": target, "message": "ping", "timeoutSeconds": 0},
                }
                async with gate, http.post("/tools/invoke", json=body) as resp:
                    resp.raise_for_status()
                    return str((await resp.json())["result"]["runId"])

            return await asyncio.gather(*(one(target) for target in targets))

    run_ids = asyncio.run(fire())
    progress.update(task, description=f"{label}: waiting for runs")
    ended = wait_runs(st, run_ids, progress, task, timeout_s=300)
    progress.remove_task(task)
    ok = [end for status, end in ended.values() if status == "ok"]
    written = sum(length >= 2 for length in st.transcript_lengths(targets))
    span_s = (max(ok) - t0_ms) / 1000 if ok else float("inf")
    return len(ok) / span_s, min(len(ok), written)


def wait_runs(
    st: Stack, run_ids: Sequence[str], progress: Progress, task: Any, *, timeout_s: float
) -> dict[str, tuple[str, int]]:
    """Poll run records until every run is terminal; run id → (status, endedAt ms)."""
    pending = set(run_ids)
    done: dict[str, tuple[str, int]] = {}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        ended = st.run_ends(list(pending))
        done.update(ended)
        pending.difference_update(ended)
        progress.update(task, completed=len(done))
        if pending:
            st.check_alive()
            time.sleep(_POLL_S)
    return done


def _anchor_rate(st: Stack, app: Celery, progress: Progress, n: int, label: str) -> float:
    """No-op tasks per second from the first `.delay()` to the last task's `date_done`."""
    task = progress.add_task(label, total=n)
    noop = app.tasks[NOOP]
    t0 = dt.datetime.now(dt.UTC)
    ids = [noop.delay().id for _ in range(n)]
    keys = [app.backend.get_key_for_task(task_id) for task_id in ids]
    finished: dict[bytes, dt.datetime] = {}
    deadline = time.monotonic() + 300
    while len(finished) < n and time.monotonic() < deadline:
        pending = [k for k in keys if k not in finished]
        st.polled_commands["mget"] += 1
        for key, raw in zip(pending, app.backend.mget(pending), strict=True):
            if raw is not None:
                done_at = dt.datetime.fromisoformat(orjson.loads(raw)["date_done"])
                finished[key] = done_at if done_at.tzinfo else done_at.replace(tzinfo=dt.UTC)
        progress.update(task, completed=len(finished))
        if len(finished) < n:
            time.sleep(_POLL_S)
    progress.remove_task(task)
    if len(finished) < n:
        raise TimeoutError(f"{label}: only {len(finished)}/{n} no-op tasks finished")
    span_s = (max(finished.values()) - t0).total_seconds()
    return n / span_s


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
