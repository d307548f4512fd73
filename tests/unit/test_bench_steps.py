"""The bench's attribution of a send+wait's commands to its steps (`bench.command_steps`)."""

from __future__ import annotations

import hashlib

import pytest

from switchboard.shared.store.lua_scripts import load
from switchboard.shared.store.stats import Monitored
from switchboard_bench.command_steps import attribute, scripts_by_sha, steps_markdown, summary

pytestmark = pytest.mark.unit

SHAS = {"s1": "start_run", "c1": "claim_run", "f1": "finish_run", "a1": "advance_link"}
API, WORKER = "127.0.0.1:1000", "127.0.0.1:2000"


def _script(sha: str, ran: int, client: str = WORKER) -> list[Monitored]:
    """An EVALSHA and the commands its script ran."""
    return [Monitored(client, f"EVALSHA {sha} 1 k"), *[Monitored("lua", "HGET k f")] * ran]


def _send() -> list[Monitored]:
    """One send+wait as MONITOR shows it (a heartbeat and a bench poll in the middle)."""
    return [
        Monitored(API, "GET sb:authfail:127.0.0.1"),
        Monitored(API, "HGETALL sb:s:agent:main:main"),
        *_script("s1", 14, API),
        Monitored(API, "LPUSH sb.runs {}"),
        Monitored(API, "HSET sb:apis vm:1 {}"),
        Monitored(WORKER, "BRPOP sb.runs 1"),
        *_script("c1", 11),
        Monitored("127.0.0.1:3000", "ZCARD sb:idx:leases"),
        *_script("f1", 17),
        *_script("s1", 13),
        *_script("f1", 16),
        *_script("a1", 3),
        Monitored(WORKER, "ZREM sb:idx:outbox r1 r2"),
        Monitored(WORKER, "PUBLISH /0.celeryev/worker.heartbeat {}"),
    ]


def test_each_call_counts_with_the_step_its_place_in_the_send_names() -> None:
    """Script calls count their script's commands in their step (the second start and end
    of a send are the announce's); plain commands go with the step before them, the
    broker's to `message`, heartbeats to `other`, the bench's polls nowhere."""
    calls = attribute(_send(), SHAS, {"zcard", "llen", "hlen"}, "sb:apis")
    by_step: dict[str, int] = {}
    for step, _, count in calls:
        by_step[step] = by_step.get(step, 0) + count
    assert by_step == {
        "submit": 2 + 15,
        "message": 2,
        "other": 2,
        "claim": 12,
        "end": 18,
        "announce": 14 + 17,
        "delivery": 4 + 1,
    }
    assert ("announce", "start_run", 14) in calls and ("submit", "start_run", 15) in calls


def test_the_summary_is_per_send_and_the_table_shows_every_step() -> None:
    """Counts are divided by the sends; the markdown table has a column per step."""
    from collections import Counter

    by_step: dict[str, Counter[str]] = {}
    for send in (_send(), _send()):  # each send attributed on its own
        for step, name, count in attribute(send, SHAS, {"zcard"}, "sb:apis"):
            by_step.setdefault(step, Counter())[name] += count
    out = summary(by_step, 2)
    assert out["steps"]["end"] == {"redisCommands": 18.0, "by": {"finish_run": 18.0}}
    assert out["redisCommands"] == sum(s["redisCommands"] for s in out["steps"].values())
    table = steps_markdown([{"costs": {"sendWait": {"steps": out}}}])
    assert "| submit |" in table[1] and "finish_run 18" in table[4]
    assert steps_markdown([{"costs": {}}]) == []


def test_the_shas_are_the_store_scripts_as_loaded() -> None:
    """An EVALSHA names a script by the SHA-1 of its expanded source."""
    sha = hashlib.sha1(load("finish_run").source.encode(), usedforsecurity=False).hexdigest()
    assert scripts_by_sha()[sha] == "finish_run"
