"""Cluster-wide counters in one Redis hash (``Keyspace.metrics``), read by the api's ``/metrics``.

Every api and worker process adds to the same hash, so a scrape of any api sees the whole
cluster. Run counters are added inside the run scripts (``store/lua/includes/run_metrics.lua``:
a run's start in its claim, its end, status and duration in ``finish_run.lua``), so they
cost no extra round trip. Flow counters (reply-back rounds, announces, deliveries) are one
``HINCRBY`` after the state change they count succeeded, so a step that runs twice counts
once.

Hash fields: ``<counter>`` or ``<counter>:<label>[:<label>]``; the run duration histogram
keeps one non-cumulative count per bucket (``run_duration_le:<ms>`` or ``:+Inf``) plus
``run_duration_sum_ms`` and ``run_duration_count``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from switchboard.shared.services import Services

log = logging.getLogger("switchboard.metrics")

RUNS_STARTED = "runs_started"
RUNS_ENDED = "runs_ended"  # :<status>
RUN_DURATION_LE = "run_duration_le"  # :<upper bound ms> | :+Inf (non-cumulative)
RUN_DURATION_SUM_MS = "run_duration_sum_ms"
RUN_DURATION_COUNT = "run_duration_count"
A2A_ROUNDS = "a2a_rounds"
ANNOUNCES = "announces"  # :<kind>:<outcome>
DELIVERIES = "deliveries"  # :<outcome>

# Upper bounds of the run duration histogram (ms), from claim to end (parked time included).
RUN_DURATION_BUCKETS_MS: tuple[int, ...] = (
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    1_800_000,
    3_600_000,
)


def field_name(counter: str, *labels: str) -> str:
    """The hash field of a counter with its labels (``deliveries:failed``)."""
    return ":".join((counter, *labels))


def count(svc: Services, counter: str, *labels: str) -> None:
    """Add one to a counter; a Redis error is logged, never raised (metrics never fail a step)."""
    svc.store.counters.add(field_name(counter, *labels))


def read_counters(raw: Mapping[bytes | str, bytes | str]) -> dict[str, int]:
    """Decode an ``HGETALL`` of the metrics hash to field → value."""
    out: dict[str, int] = {}
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else key
        text = value.decode() if isinstance(value, bytes) else value
        try:
            out[name] = int(text)
        except ValueError:
            log.warning("metric field %s holds %r; ignored", name, text)
    return out


def labelled(counters: Mapping[str, int], counter: str) -> dict[tuple[str, ...], int]:
    """The values of one labelled counter, by label tuple (``{("a2a", "skipped"): 2}``)."""
    prefix = counter + ":"
    return {
        tuple(name[len(prefix) :].split(":")): value
        for name, value in counters.items()
        if name.startswith(prefix)
    }
