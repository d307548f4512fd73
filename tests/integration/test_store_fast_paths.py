"""The one-round-trip store steps: start, claim, finish, paged listing, and the waiter."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
from switchboard.shared.store.runs import NewRun, RunRecord
from switchboard.shared.store.sessions import IndexCursor
from switchboard.shared.store.waiter import Fetch, RunWaiter
from switchboard_testkit import store_reads

pytestmark = pytest.mark.integration


def _rid(name: str, key: str) -> str:
    """The id of the run a test calls ``name`` in session ``key`` (in its slot group)."""
    return store_reads.id_beside(key, name)


def _new_run(name: str, key: str, text: str = "hi", *, watched: bool = False) -> NewRun:
    return NewRun(
        run_id=_rid(name, key),
        session_key=key,
        message={"role": "user", "content": text, "timestamp": 1},
        timeout_s=30,
        watched=watched,
    )


def test_start_creates_the_session_and_records_the_run_in_one_step(services: Services) -> None:
    runs, sessions = services.store.runs, services.store.sessions
    key = "agent:main:fast-start"
    first = runs.start(_new_run("run-a", key), on_create={"chatType": "direct"})
    assert first.took_lane and first.session_created and first.existing_run_id is None
    entry = sessions.get(key)
    assert entry is not None and entry.session_id == first.session_id
    assert entry.get("chatType") == "direct"
    assert sessions.key_for_session_id(first.session_id) == key
    assert [
        k for k, _ in sessions.recent_keys(agent_ids=None, kinds=None, min_updated_ms=None, limit=5)
    ] == [key]
    # A second run queues behind the lane holder; the entry is not created again.
    second = runs.start(_new_run("run-b", key))
    assert not second.took_lane and not second.session_created
    assert second.session_id == first.session_id
    assert runs.lane_holder(key) == _rid("run-a", key) and runs.lane_queue(key) == [
        _rid("run-b", key)
    ]
    rec = runs.get(_rid("run-b", key))
    assert (
        rec is not None
        and rec.status == "queued"
        and rec.message
        == {
            "role": "user",
            "content": "hi",
            "timestamp": 1,
        }
    )


def test_start_with_a_known_idempotency_key_records_nothing(services: Services) -> None:
    runs = services.store.runs
    key = "agent:main:fast-idem"
    assert runs.start(_new_run("run-1", key), idempotency_key="k").existing_run_id is None
    again = runs.start(_new_run("run-2", key), idempotency_key="k")
    assert again.existing_run_id == _rid("run-1", key) and not again.took_lane
    assert runs.get(_rid("run-2", key)) is None
    assert runs.lane_queue(key) == []


def test_gateway_dedupes_on_the_fast_path(services: Services) -> None:
    services.queue = _NullQueue()
    req = RunRequest(session_key="agent:main:fast-gw", message="hello", idempotency_key="x")
    first = start_run(services, req)
    second = start_run(services, req)
    assert second == {"runId": first["runId"], "status": "accepted", "deduplicated": True}


def test_claim_answers_the_run_the_session_and_the_history(services: Services) -> None:
    runs = services.store.runs
    key = "agent:main:fast-claim"
    runs.start(_new_run("run-c", key, "first"), on_create={"spawnDepth": 2})
    claim = runs.claim(_rid("run-c", key), key, history=10)
    assert not isinstance(claim, str)
    assert claim.run is not None and claim.run.status == "running" and claim.run.attempt == 1
    assert claim.session is not None and claim.session["spawnDepth"] == "2"
    assert [m["content"] for m in claim.history or []] == ["first"]
    assert claim.history and claim.history[0]["__openclaw"] == {"seq": 1}
    # Claimed once: a second claim is refused with the reason.
    assert runs.claim(_rid("run-c", key), key) == "skip:running"
    # A run enqueued under another key is claimed under its own.
    runs.start(_new_run("run-d", "agent:main:other"))
    moved = runs.claim(_rid("run-d", "agent:main:other"), key)
    assert not isinstance(moved, str) and moved.run is not None
    assert moved.run.session_key == "agent:main:other"
    assert runs.claim("no-such-run", key) == "missing:"


def test_finish_answers_the_ended_run(services: Services) -> None:
    runs = services.store.runs
    key = "agent:main:fast-finish"
    runs.start(_new_run("run-e", key))
    claim = runs.claim(_rid("run-e", key), key)
    assert not isinstance(claim, str)
    res = runs.finish(_rid("run-e", key), key, claim.attempt, status="ok", reply="done")
    assert res.applied and res.run is not None
    assert res.run.status == "ok" and res.run.reply == "done" and res.run.ended_at_ms


def test_recent_page_walks_deep_pages_through_ties(services: Services) -> None:
    sessions = services.store.sessions
    ks = services.store.ks
    # 25 sessions, scores in groups of 4 equal ones (ties across page ends).
    expected = []
    pipe = services.store.redis.pipeline(transaction=False)
    for i in range(25):
        key = f"agent:main:page-{i:02d}"
        score = 1_000 - i // 4
        pipe.zadd(ks.beside(key).updated_all, {key: score})
        expected.append((key, score))
    pipe.execute()
    expected.sort(key=lambda pair: (-pair[1], pair[0]))
    seen: list[tuple[str, int]] = []
    cursor: IndexCursor | None = None
    pages = 0
    while True:
        page, cursor = sessions.recent_page(
            agent_ids=None, kinds=None, min_updated_ms=None, limit=3, after=cursor
        )
        seen += page
        pages += 1
        if cursor is None:
            break
        assert pages < 20
    assert sorted(seen, key=lambda p: (-p[1], p[0])) == expected
    assert len({k for k, _ in seen}) == 25
    assert [s for _, s in seen] == sorted((s for _, s in seen), reverse=True)
    # A lower bound on the score stops the walk early.
    page, cursor = sessions.recent_page(agent_ids=None, kinds=None, min_updated_ms=999, limit=50)
    assert len(page) == 8 and cursor is None


def test_recent_entries_is_the_first_page_with_its_entries(services: Services) -> None:
    """Across two kind indexes with tied scores: the same rows, order and cursor as
    `recent_page`, each with its session entry (None where the entry is gone)."""
    sessions = services.store.sessions
    ks = services.store.ks
    pipe = services.store.redis.pipeline(transaction=False)
    for i in range(12):
        kind = "cron" if i % 2 else "hook"
        key = f"agent:main:{kind}:t-{i:02d}"
        score = 5_000 - i // 3  # ties of three, mixed over both indexes
        pipe.zadd(ks.beside(key).updated_kind("main", kind), {key: score})
        if i != 4:  # one index row whose entry is gone
            pipe.hset(ks.session(key), mapping={"sessionId": f"s-{i}", "updatedAt": score})
    pipe.execute()
    for limit, floor in ((5, None), (12, None), (20, None), (4, 4_998)):
        options: dict[str, Any] = {
            "agent_ids": ["main"],
            "kinds": ["cron", "hook"],
            "min_updated_ms": floor,
            "limit": limit,
        }
        page, cursor = sessions.recent_page(**options)
        rows, entries, entries_cursor = sessions.recent_entries(**options)
        assert rows == page and entries_cursor == cursor
        assert [e.key if e else None for e in entries] == [
            None if key.endswith("t-04") else key for key, _ in rows
        ]
        assert all(e.updated_at_ms == s for e, (_, s) in zip(entries, rows, strict=True) if e)


@contextlib.asynccontextmanager
async def _counting_waiter(
    services: Services, redis_url: str
) -> AsyncIterator[tuple[RunWaiter, Fetch, list[str]]]:
    """A started waiter on its own client, and a fetch that records each run it reads."""
    client = aioredis.Redis.from_url(redis_url)
    waiter = RunWaiter(client, services.store.ks)
    await waiter.start()
    fetches: list[str] = []

    async def fetch(run_id: str) -> RunRecord | None:
        fetches.append(run_id)
        return await waiter.fetch(run_id)

    try:
        yield waiter, fetch, fetches
    finally:
        await waiter.stop()
        await client.aclose()


def _end(services: Services, run_id: str, key: str, reply: str) -> None:
    claim = services.store.runs.claim(run_id, key)
    assert not isinstance(claim, str)
    services.store.runs.finish(run_id, key, claim.attempt, status="ok", reply=reply)


def test_waiter_answers_from_the_run_ended_message(services: Services, redis_url: str) -> None:
    runs = services.store.runs
    key = "agent:main:fast-wait"

    async def scenario() -> tuple[RunRecord | None, RunRecord | None, int]:
        async with _counting_waiter(services, redis_url) as (waiter, fetch, fetches):
            since = asyncio.get_running_loop().time()
            runs.start(_new_run("run-w", key, watched=True))

            def end_later() -> None:
                time.sleep(0.2)
                _end(services, _rid("run-w", key), key, "pong")

            threading.Thread(target=end_later).start()
            woken = await waiter.wait(_rid("run-w", key), 10, fetch, since=since)
            # Ended before this wait began: answered from the runs ended lately.
            again = await waiter.wait(_rid("run-w", key), 10, fetch, since=since)
            return woken, again, len(fetches)

    woken, again, fetches = asyncio.run(scenario())
    assert woken is not None and woken.status == "ok" and woken.reply == "pong"
    assert again is not None and again.reply == "pong"
    assert fetches == 0


def test_only_the_end_of_a_run_someone_waits_for_is_published(
    services: Services, redis_url: str
) -> None:
    """A fire-and-forget run ends without a run-ended message; a run started watched, or
    marked by a waiter's read while it runs, ends with one (and wakes that waiter at once,
    not at its next poll)."""
    runs = services.store.runs
    key = "agent:main:fast-watch"

    async def scenario() -> tuple[list[str], RunRecord | None, int]:
        async with _counting_waiter(services, redis_url) as (waiter, fetch, fetches):
            channel = waiter.redis.pubsub()
            await channel.subscribe(services.store.ks.run_events)
            runs.start(_new_run("run-quiet", key))
            await asyncio.to_thread(_end, services, _rid("run-quiet", key), key, "unwatched")
            runs.start(_new_run("run-loud", key, watched=True))
            await asyncio.to_thread(_end, services, _rid("run-loud", key), key, "watched")
            runs.start(_new_run("run-late", key))

            def end_later() -> None:
                time.sleep(0.3)
                _end(services, _rid("run-late", key), key, "late")

            ending = asyncio.create_task(asyncio.to_thread(end_later))
            # A wake-up missed would show as a second read after 5 s (the poll).
            woken = await waiter.wait(_rid("run-late", key), 10, fetch)
            await ending
            published = []
            deadline = asyncio.get_running_loop().time() + 1.0
            while asyncio.get_running_loop().time() < deadline:
                msg = await channel.get_message(ignore_subscribe_messages=True, timeout=0.2)
                if msg is not None:
                    published.append(orjson.loads(msg["data"])["runId"])
            await channel.aclose()
            return published, woken, len(fetches)

    published, woken, fetches = asyncio.run(scenario())
    assert published == [_rid("run-loud", key), _rid("run-late", key)]
    assert woken is not None and woken.status == "ok" and woken.reply == "late"
    assert fetches == 1
    quiet = runs.get(_rid("run-quiet", key))
    assert quiet is not None and quiet.reply == "unwatched"
    # A waiter's mark never creates a run that does not exist.
    assert asyncio.run(_fetch_unknown(services, redis_url)) is None
    assert not services.store.redis.exists(
        services.store.ks.run(_rid("run-nobody", "agent:main:nobody"))
    )


async def _fetch_unknown(services: Services, redis_url: str) -> RunRecord | None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return await RunWaiter(client, services.store.ks).fetch(
            _rid("run-nobody", "agent:main:nobody")
        )
    finally:
        await client.aclose()


def test_waiter_reads_state_for_runs_it_did_not_see_start(
    services: Services, redis_url: str
) -> None:
    runs = services.store.runs
    key = "agent:main:fast-old"
    runs.start(_new_run("run-old", key))
    claim = runs.claim(_rid("run-old", key), key)
    assert not isinstance(claim, str)
    runs.finish(_rid("run-old", key), key, claim.attempt, status="error", error="boom")

    async def scenario() -> tuple[RunRecord | None, RunRecord | None]:
        client = aioredis.Redis.from_url(redis_url)
        waiter = RunWaiter(client, services.store.ks)
        await waiter.start()
        try:
            ended = await waiter.wait(_rid("run-old", key), 5)
            pending_since = asyncio.get_running_loop().time()
            runs.start(_new_run("run-open", key))
            open_run = await waiter.wait(_rid("run-open", key), 0.3, since=pending_since)
            return ended, open_run
        finally:
            await waiter.stop()
            await client.aclose()

    ended, open_run = asyncio.run(scenario())
    assert ended is not None and ended.status == "error" and ended.error == "boom"
    # Not ended by the deadline: the current state is read and answered.
    assert open_run is not None and open_run.status == "queued"


class _NullQueue:
    def enqueue_run(self, run_id: str, session_key: str) -> None:
        return None

    def enqueue_runs(self, runs: Sequence[tuple[str, str]]) -> None:
        return None

    def enqueue_resume(self, run_id: str, session_key: str) -> None:
        return None

    def enqueue(self, task: str, *args: str, countdown_s: float | None = None) -> None:
        return None


def test_recent_entries_follows_a_page_that_changed_since_the_last_listing(
    services: Services,
) -> None:
    """The listing hands its script the hashes of the page it expects; a page with new
    sessions (or a cold store) is answered right after a retry, then in one call."""
    if services.store.ks.groups > 1:
        pytest.skip("the one-step listing script reads one slot group's indexes only")
    sessions = services.store.sessions
    calls: list[str] = []
    script = sessions._lua["recent_entries"]
    counted = script.script

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append("call")
        return counted(*args, **kwargs)

    script.script = counting  # type: ignore[assignment]
    options: dict[str, Any] = {"agent_ids": None, "kinds": None, "min_updated_ms": None}
    for i in range(3):
        sessions.ensure(f"agent:main:hook:l-{i}")
    rows, entries, _ = sessions.recent_entries(**options, limit=2)
    assert [k for k, _ in rows] == ["agent:main:hook:l-2", "agent:main:hook:l-1"]
    assert [e.key for e in entries if e] == [k for k, _ in rows]
    assert len(calls) == 2  # cold: the script named the page, then read it
    calls.clear()
    assert sessions.recent_entries(**options, limit=2)[0] == rows
    assert len(calls) == 1  # the same page: one call
    calls.clear()
    time.sleep(0.002)
    sessions.ensure("agent:main:hook:l-new")
    rows, entries, _ = sessions.recent_entries(**options, limit=2)
    assert [k for k, _ in rows] == ["agent:main:hook:l-new", "agent:main:hook:l-2"]
    assert [e.session_id for e in entries if e] == [
        sessions.get(k).session_id  # type: ignore[union-attr]
        for k, _ in rows
    ]
    assert len(calls) == 2
