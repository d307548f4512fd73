"""The bench's anchors are plain Celery, started and timed the way a user would."""

from __future__ import annotations

import sys
from typing import Any, cast

import pytest
from celery import Celery
from rich.progress import Progress

from switchboard_bench import anchor, messaging
from switchboard_bench.harness import Stack, _anchor_argv

pytestmark = pytest.mark.unit

URL = "redis://127.0.0.1:6390/0"


def test_anchor_app_is_celery_at_its_defaults() -> None:
    """The anchor app differs from `Celery(broker=url, backend=url)` in no setting."""
    url = anchor.shapes(64)[0].url(URL)
    plain = Celery("plain", broker=url, backend=url, set_as_current=False)
    ours = anchor.create_app(url)
    assert dict(ours.conf.changes) == dict(plain.conf.changes)
    assert anchor.NOOP in ours.tasks


def test_anchor_workers_start_with_the_command_a_user_types() -> None:
    """Prefork runs `celery -A … worker` alone; threads adds only its pool and concurrency."""
    prefork, threads = anchor.shapes(64)
    celery = [sys.executable, "-m", "celery", "-A", "switchboard_bench.anchor", "worker"]
    assert _anchor_argv(prefork) == celery
    assert _anchor_argv(threads) == [*celery, "-P", "threads", "-c", "64"]


def test_each_anchor_has_its_own_database_beside_the_products() -> None:
    """The anchors' URLs keep the stack's server and pick databases of their own, not 0."""
    urls = [shape.url(URL) for shape in anchor.shapes(64)]
    assert urls == ["redis://127.0.0.1:6390/1", "redis://127.0.0.1:6390/2"]


class _Settled:
    """A stand-in stack that records when the bench waited for it to settle."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def settle(self) -> None:
        self.calls.append("settle")


def test_latency_samples_are_taken_in_back_to_back_blocks() -> None:
    """Each side's samples come in blocks of back-to-back calls after a settle and untimed
    lead-in calls, the sides alternating block by block in a rotating order."""
    calls: list[str] = []
    steps: dict[str, Any] = {name: (lambda i, n=name: calls.append(f"{n}{i}")) for name in "ab"}
    n = messaging._BLOCK + 5
    with Progress(disable=True) as progress:
        samples = messaging._in_blocks(cast(Stack, _Settled(calls)), progress, steps, n)
    assert {name: len(s) for name, s in samples.items()} == {"a": n, "b": n}
    lead = messaging._LEAD_IN
    blocks = "|".join(calls).split("settle")[1:]
    assert len(blocks) == 4  # two blocks per side
    firsts = [block.strip("|").split("|") for block in blocks]
    assert [b[0][0] for b in firsts] == ["a", "b", "b", "a"]  # the order rotates
    first_a = firsts[0]
    assert all(c.startswith("a-") for c in first_a[:lead])  # the untimed lead-in
    assert first_a[lead:] == [f"a{i}" for i in range(messaging._BLOCK)]  # then back to back
