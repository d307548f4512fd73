"""The `scale` scenario's layout and its outcome: the shapes and columns it measures, how
much each measures, and the one line, parameters and checks its rows are reported with
(`shapes` measures them).

A column is a broker and where the state is: on the stack's Redis, or on a private Redis
Cluster of `CLUSTER_PRIMARIES` primaries whose keys are cut into slot groups (64, the
default on a cluster), so that the state spreads over every primary; for that column each
row also says how the state's load was split over the primaries (``stateSpread``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from switchboard_bench.harness import WORKER_CONCURRENCY
from switchboard_bench.report import Outcome, ratio

SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (2, 2))  # (apis, workers)
BROKERS = ("redis", "rabbitmq")
CLUSTER_PRIMARIES = 3  # no replicas: the bench measures the load, not a failover
CLUSTER = f"redis-cluster-{CLUSTER_PRIMARIES}"
# Where the state is (a row's ``store``) -> primaries of its private cluster (0: none, the
# state is on the stack's Redis).
STORES = {"redis": 0, CLUSTER: CLUSTER_PRIMARIES}
# (broker, store) in the order measured; a cluster cannot be a broker: the stack's Redis is.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("redis", "redis"),
    ("rabbitmq", "redis"),
    ("redis", CLUSTER),
)
# The Redis servers a row's commands and Redis CPU are summed over, by store.
REDIS_COUNTED = {
    "redis": "the stack's Redis (state, broker and the anchor's results)",
    CLUSTER: f"the stack's Redis (broker and the anchor's results) + every node of the "
    f"{CLUSTER_PRIMARIES}-primary cluster (state: 64 slot groups spread over the primaries; "
    "each one's share in stateSpread)",
}
ANCHOR = "prefork"  # Celery's defaults: prefork pool, one process per core
# Connections the send+wait loop spreads its calls over (SO_REUSEPORT hashes each
# connection to one api: with 8, all on one of two apis has odds of 1 in 128).
CONNECTIONS = 8


@dataclass(frozen=True)
class Counts:
    """How much one shape measures."""

    sends: int  # fire-and-forget runs per round
    rounds: int
    latency: int  # send+wait samples (and as many anchor round trips)


FULL = Counts(sends=1000, rounds=3, latency=200)
QUICK = Counts(sends=100, rounds=1, latency=20)


def column(broker: str, store: str) -> str:
    """A column's name: the broker, and where the state is when not on the stack's Redis."""
    return broker if store == "redis" else f"{broker} + state on {store}"


def spread_text(rows: list[dict[str, Any]]) -> str | None:
    """How the state's commands were split over the cluster's primaries, shape by shape,
    with the busiest primary's share over the mean beside the slot groups' (None without
    a measured split)."""
    split = [r for r in rows if r.get("stateSpread", {}).get("commands")]
    if not split:
        return None

    def shares(values: dict[str, float | None]) -> str:
        return "/".join("—" if v is None else f"{v:.2f}" for v in values.values())

    shapes = ", ".join(
        f"{r['apis']}x{r['workers']} {shares(r['stateSpread']['commands'])} "
        f"({r['stateSpread']['busiestOverMean']['commands']}x)"
        for r in split
    )
    groups = split[0]["stateSpread"]
    owned = "/".join(str(n) for n in groups["slotGroupsOwned"].values())
    return (
        f"the state's commands over {split[0]['store']}'s primaries: {shapes}, busiest over "
        f"the mean in brackets (slot groups {owned}: {groups['busiestOverMean']['slotGroups']}x)"
    )


def outcome(rows: list[dict[str, Any]], counts: Counts) -> Outcome:
    """The scenario's outcome from its rows (a skipped column's rows say why)."""
    measured = [r for r in rows if "skipped" not in r]
    by = {(r["broker"], r["store"], r["apis"], r["workers"]): r for r in measured}
    one, four = by.get(("redis", "redis", 1, 1)), by.get(("redis", "redis", 2, 2))
    gain = ratio(four["runsPerS"], one["runsPerS"]) if one and four else None
    incomplete = sum(r["sends"] - r["completed"] for r in measured)
    not_ok = sum(r["sendWaitNotOk"] for r in measured)
    anchors = {b: _anchor_text(measured, b) for b in BROKERS}
    return Outcome(
        scenario="scale",
        title="apis x workers on Redis and RabbitMQ, and with the state on a Redis Cluster",
        figure={"shapes": rows, "scaleOutGain": gain},
        anchor={
            "what": "no-op Celery task on Celery's default prefork pool at its defaults, "
            "on the same broker, measured in each shape's stack (in the first one here)",
            **anchors,
        },
        ratio=gain,
        ratio_text="runs/s 2x2 / runs/s 1x1, state and broker on the stack's Redis",
        target="every shape measured in every column available (a sizing figure; no speed target)",
        passed=True,
        figure_text="; ".join(_parts(rows, by)),
        anchor_text="; ".join(anchors.values()),
        parameters=_parameters(counts),
        checks={"allCompleted": incomplete == 0, "sendWaitAllOk": not_ok == 0},
        costs={
            f"{column(r['broker'], r['store'])} {r['apis']}x{r['workers']}": r["costs"]
            for r in measured
        },
        notes=[
            *([f"{incomplete} fire-and-forget run(s) did not complete ok"] if incomplete else []),
            *([f"{not_ok} send+wait(s) did not answer ok"] if not_ok else []),
        ],
    )


def _anchor_text(measured: list[dict[str, Any]], broker: str) -> str:
    first = next((r for r in measured if r["broker"] == broker), None)
    if first is None:
        return f"{broker}: —"
    a = first["anchor"]
    return f"{broker}: {a['tasksPerS']:.0f} tasks/s, p50 {a['roundTrip']['p50_ms']:.1f} ms"


def _parts(rows: list[dict[str, Any]], by: dict[tuple[Any, ...], dict[str, Any]]) -> list[str]:
    """The summary line's parts: each column's shapes, Redis commands per run, the split."""

    def text(r: dict[str, Any]) -> str:
        p50 = r["sendWait"]["p50_ms"]
        return f"{r['apis']}x{r['workers']} {r['runsPerS']:.0f}/s p50 {p50:.1f} ms"

    parts = []
    for broker, store in COLUMNS:
        of_column = [r for r in rows if (r["broker"], r["store"]) == (broker, store)]
        shown = [text(r) for r in of_column if "skipped" not in r]
        skipped = [r["skipped"] for r in of_column if "skipped" in r]
        if shown:
            parts.append(f"{column(broker, store)}: " + ", ".join(shown))
        elif skipped:
            parts.append(f"{column(broker, store)}: skipped ({skipped[0]})")
    per_run = {
        store: r["costs"].get("redisCommands")
        for store in STORES
        if (r := by.get(("redis", store, 1, 1))) is not None
    }
    if per_run.get("redis") is not None:
        parts.append(f"{per_run['redis']:g} Redis commands per run")
    if per_run.get(CLUSTER) is not None:
        parts.append(f"{per_run[CLUSTER]:g} with the state on {CLUSTER} (broker's Redis + nodes)")
    split = spread_text(rows)
    return [*parts, split] if split else parts


def _parameters(counts: Counts) -> dict[str, Any]:
    return {
        "shapes": [f"{a}x{w}" for a, w in SHAPES],
        "brokers": list(BROKERS),
        "columns": [column(broker, store) for broker, store in COLUMNS],
        "sendsPerRound": counts.sends,
        "rounds": counts.rounds,
        "sendWaitSamples": counts.latency,
        "runsPerS": "POST /tools/invoke sessions_send timeoutSeconds=0, 32 requests in "
        "flight, from the first request to the last target run's end; median of rounds",
        "sendWait": "POST /tools/invoke sessions_send timeoutSeconds=30, back-to-back "
        f"blocks, over {CONNECTIONS} keep-alive connections taken in turn",
        "apis": "several api processes share one port with SO_REUSEPORT",
        "workerConcurrency": WORKER_CONCURRENCY,
        "model": "builtin/echo",
        "maxPingPongTurns": 0,
        "costs": "INFO commandstats of the stack's Redis (and of every cluster node when "
        "the state is on the cluster, summed) and /proc CPU of every api, worker and "
        "redis-server, from the first send until follow-ups drained; on RabbitMQ the "
        "broker's traffic is not in the Redis count",
        "anchor": f"celery -A switchboard_bench.anchor worker ({ANCHOR} pool, "
        "concurrency = cores), one per stack; its results on the stack's Redis",
        "cluster": f"{CLUSTER}: the state on a private Redis Cluster of "
        f"{CLUSTER_PRIMARIES} primaries, no replicas, each owning an equal range of slots "
        "(redis+cluster://, SWITCHBOARD_SLOT_GROUPS unset: 64 slot groups, each under a "
        "hash tag of its own, spread over the primaries), the broker and the anchor on the "
        "stack's Redis; Redis commands and CPU: " + REDIS_COUNTED[CLUSTER],
        "stateSpread": "cluster rows: each primary's share (by address, in slot order) of "
        "the state's Redis commands (INFO commandstats of each node, before and after; the "
        "bench's polls included, benchPollsShare at most) and of its Redis CPU (/proc) over "
        "the throughput rounds, of the slot groups (which primary owns each group's hash "
        "tag, asked of the cluster), for each the busiest primary's share over the mean, "
        "and the commands per run the busiest ran above the others' mean",
        "brokerCosts": "cluster rows: the broker's Redis alone over the throughput rounds "
        "(the product's Celery messages; the anchor is idle then), less the bench's polls",
    }
