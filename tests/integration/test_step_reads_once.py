"""A flow step at the end of the primary run reads the target's entry and the flow once,
announce start included, and not at all when the run's end step read them for it;
`sessions_send` reads the target's entry once; a sub-agent's announce takes its spawn, run
and session from the child's end step."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from switchboard.shared.flows import reply_back
from switchboard.shared.flows.a2a_flow import create_flow, load_flow
from switchboard.shared.flows.a2a_rules import ping_pong_skip_reason
from switchboard.shared.flows.reply_back import STEP, step_after
from switchboard.shared.flows.steps import run_step_inline
from switchboard.shared.flows.subagent import ANNOUNCE_STEP
from switchboard.shared.runtime import executor
from switchboard.shared.services import Services
from switchboard.shared.store.runs import NewRun, RunRecord
from switchboard.shared.tools.registry import ToolContext
from switchboard.shared.tools.sessions_send import handle
from switchboard.shared.tools.sessions_spawn import sessions_spawn
from switchboard_testkit import store_reads

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
TARGET = "agent:main:hook:once"  # a key naming no chat: its announce route is on the entry


PRIMARY = store_reads.id_beside(TARGET, "primary-run")  # in its session's slot group


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Same-agent visibility, no ping-pong rounds: the primary run goes to the announce."""
    return {
        "tools": {"sessions": {"visibility": "agent"}},
        "session": {"agentToAgent": {"maxPingPongTurns": 0}},
    }


@pytest.fixture
def target_entry(services: Services) -> str:
    """The target's session entry, with the chat its announces go to."""
    services.store.sessions.ensure(TARGET, on_create={"chatType": "direct"})
    services.store.sessions.patch(
        TARGET, {"deliveryContext": {"channel": "relay", "to": "group:room7"}}
    )
    return TARGET


@pytest.fixture
def reads(services: Services, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts of session entries read (`sessions.get`, by session key) and of hashes read
    with HGETALL (by Redis key), from here on."""
    counts: Counter[str] = Counter()
    sessions, client = services.store.sessions, services.store.redis
    real_get, real_hgetall = sessions.get, client.hgetall

    def get(key: str) -> Any:
        counts[f"entry:{key}"] += 1
        return real_get(key)

    def hgetall(name: Any) -> Any:
        counts[f"hgetall:{name.decode() if isinstance(name, bytes) else name}"] += 1
        return real_hgetall(name)

    monkeypatch.setattr(sessions, "get", get)
    monkeypatch.setattr(client, "hgetall", hgetall)
    return counts


def _new_flow(services: Services, target: str) -> str:
    """A send's flow from main to ``target`` with no ping-pong rounds."""
    return create_flow(
        services,
        requester_key=MAIN,
        requester_channel="webchat",
        target_key=target,
        target_display=target,
        message="hello",
        max_turns=0,
        skip_reason=ping_pong_skip_reason(MAIN, target, 0),
    )


def _ended_primary_run(services: Services, flow_id: str, *, read_at_end: bool = False) -> RunRecord:
    """Start the flow's primary run (linked as `run:0`), claim it and end it `ok` (with
    ``read_at_end``, its end step reads the flow and the session for the follow-up)."""
    runs = services.store.runs
    runs.start(
        NewRun(
            run_id=PRIMARY,
            session_key=TARGET,
            message={"role": "user", "content": "hello", "timestamp": 1},
            timeout_s=30,
            meta={"flowId": flow_id, "a2a": "primary"},
            on_end=step_after(flow_id, 0),
            link=(services.store.ks.flow(flow_id), "run:0"),
        ),
        on_create={},
    )
    claim = runs.claim(PRIMARY, TARGET)
    assert not isinstance(claim, str)
    follow = services.store.ks.flow(flow_id) if read_at_end else None
    done = runs.finish(
        PRIMARY, TARGET, claim.attempt, status="ok", reply="hi back", follow_up_reads=follow
    )
    assert done.applied and done.run is not None
    return done.run


def test_the_primary_runs_step_reads_the_target_entry_and_the_flow_once(
    services: Services, target_entry: str, reads: Counter[str]
) -> None:
    """At turn 0 with maxPingPongTurns 0, the step reads the target's entry once (announce
    route, send policy and the announce run's start) and the flow once, and the announce
    run it starts is recorded and linked as `announceRunId`."""
    flow_id = _new_flow(services, target_entry)
    ended = _ended_primary_run(services, flow_id)
    reads.clear()
    run_step_inline(services, STEP, flow_id, "0", following=ended)
    entry_reads = reads[f"entry:{target_entry}"]
    entry_reads += reads[f"hgetall:{services.store.ks.session(target_entry)}"]
    assert entry_reads == 1
    assert reads[f"hgetall:{services.store.ks.flow(flow_id)}"] == 1
    _assert_announce_started(services, flow_id, target_entry)


def test_a_step_takes_the_flow_and_entry_its_runs_end_step_read(
    services: Services, target_entry: str, reads: Counter[str]
) -> None:
    """When the primary run's end step read the flow and the session for its follow-up,
    the step reads neither from the store, and goes on to the same announce."""
    flow_id = _new_flow(services, target_entry)
    ended = _ended_primary_run(services, flow_id, read_at_end=True)
    assert ended.read_at_end[services.store.ks.flow(flow_id)]["status"] == "running"
    reads.clear()
    run_step_inline(services, STEP, flow_id, "0", following=ended)
    assert reads[f"entry:{target_entry}"] == 0
    assert reads[f"hgetall:{services.store.ks.session(target_entry)}"] == 0
    assert reads[f"hgetall:{services.store.ks.flow(flow_id)}"] == 0
    _assert_announce_started(services, flow_id, target_entry)
    # Outside the step, reads go to the store.
    reads.clear()
    assert load_flow(services, flow_id) is not None
    assert reads[f"hgetall:{services.store.ks.flow(flow_id)}"] == 1


def _assert_announce_started(services: Services, flow_id: str, target_entry: str) -> None:
    flow = load_flow(services, flow_id)
    assert flow is not None
    assert flow.status == "announcing" and flow.get("roundOneReply") == "hi back"
    assert flow.get("announceTarget") == '{"channel":"relay","to":"group:room7"}'
    announce_id = flow.get("announceRunId")
    assert announce_id is not None and announce_id != PRIMARY
    announce = services.store.runs.get(announce_id)
    assert announce is not None and announce.session_key == target_entry
    assert announce.meta == {"flowId": flow_id, "a2a": "announce"}


def test_sessions_send_reads_the_target_entry_once(
    services: Services, target_entry: str, reads: Counter[str]
) -> None:
    """The tool reads the target's entry once for its policy check and the run's start,
    and the run it starts is linked on the flow as `run:0`."""
    ctx = ToolContext(services=services, session_key=MAIN, agent_id="main")
    result = handle(ctx, {"sessionKey": target_entry, "message": "hello", "timeoutSeconds": 0})
    assert result["status"] == "accepted"
    assert reads[f"entry:{target_entry}"] == 1
    flow = load_flow(services, result["flowId"])
    assert flow is not None and flow.run_id(0) == result["runId"]
    rec = services.store.runs.get(result["runId"])
    assert rec is not None and rec.session_key == target_entry


def test_the_step_moves_its_flow_on_in_the_announce_runs_start(
    services: Services, target_entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step that ends the loop writes the flow's move to "announcing" in the step that
    records the announce run (`LinkAdvance`), not in a write of its own before it."""
    flow_id = _new_flow(services, target_entry)
    ended = _ended_primary_run(services, flow_id, read_at_end=True)
    advances: list[dict[str, Any]] = []
    real_advance = reply_back.advance

    def counting(svc: Services, flow: Any, fields: Any, **kwargs: Any) -> bool:
        advances.append(dict(fields))
        return real_advance(svc, flow, fields, **kwargs)

    monkeypatch.setattr(reply_back, "advance", counting)
    run_step_inline(services, STEP, flow_id, "0", following=ended)
    assert advances == []
    _assert_announce_started(services, flow_id, target_entry)
    flow = load_flow(services, flow_id)
    assert flow is not None and flow.get("stopReason") == "disabled"


def test_a_step_whose_flow_moved_on_starts_no_second_announce(
    services: Services, target_entry: str
) -> None:
    """A copy of the step that read the flow before another copy moved it on (a redelivered
    step racing the first) starts nothing and leaves the flow as the first copy left it."""
    flow_id = _new_flow(services, target_entry)
    ended = _ended_primary_run(services, flow_id)
    stale = load_flow(services, flow_id)
    assert stale is not None and stale.status == "running"
    run_step_inline(services, STEP, flow_id, "0", following=ended)
    moved = load_flow(services, flow_id)
    assert moved is not None and moved.status == "announcing"
    runs_before = sorted(services.store.redis.scan_iter(services.store.ks.run("*")))

    reply_back._after_run(services, stale, 0, ended)

    assert load_flow(services, flow_id) == moved
    assert sorted(services.store.redis.scan_iter(services.store.ks.run("*"))) == runs_before


def test_an_announce_takes_the_spawn_run_and_session_its_childs_end_step_read(
    services: Services, monkeypatch: pytest.MonkeyPatch, reads: Counter[str]
) -> None:
    """A sub-agent's run names its spawn as what its follow-up reads first, so its end
    step reads the spawn and the child's session with the end; the announce run in place
    after it reads neither of them nor the child's run from the store, and announces the
    child's reply with the child's session id."""
    ctx = ToolContext(services=services, session_key=MAIN, agent_id="main")
    started = sessions_spawn(ctx, {"task": "say hi"})
    run_id, child = str(started["runId"]), str(started["childSessionKey"])
    runs, ks = services.store.runs, services.store.ks
    rec = runs.get(run_id)
    assert rec is not None
    spawn_id = str(rec.meta["spawnId"])
    follow = executor._follow_up_reads(services, rec)
    assert follow == ks.spawn(spawn_id)
    claim = runs.claim(run_id, child)
    assert not isinstance(claim, str)
    done = runs.finish(
        run_id, child, claim.attempt, status="ok", reply="hi from the child", follow_up_reads=follow
    )
    assert done.applied and done.run is not None
    assert set(done.run.read_at_end) == {ks.spawn(spawn_id), ks.session(child)}
    session_id = done.run.read_at_end[ks.session(child)]["sessionId"]

    read_keys: list[str] = []
    real_read = services.store.flows.read_hash
    real_reads = services.store.spawns.queue_announce_reads
    passed: dict[str, Any] = {}

    def read_hash(key: str) -> dict[str, str]:
        read_keys.append(key)
        return real_read(key)

    def queue_announce_reads(pipe: Any, spawn: Any, **kwargs: Any) -> Any:
        passed.update(kwargs)
        return real_reads(pipe, spawn, **kwargs)

    monkeypatch.setattr(services.store.flows, "read_hash", read_hash)
    monkeypatch.setattr(services.store.spawns, "queue_announce_reads", queue_announce_reads)
    reads.clear()
    run_step_inline(services, ANNOUNCE_STEP, spawn_id, following=done.run)
    assert reads[f"hgetall:{ks.spawn(spawn_id)}"] == 0
    assert ks.spawn(spawn_id) not in read_keys and ks.session(child) not in read_keys
    assert passed["run"] is done.run
    assert passed["child_session"] is not None
    assert passed["child_session"]["sessionId"] == session_id
    announces = [
        m
        for m in services.store.transcripts.tail(MAIN, 10)
        if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
    ]
    assert len(announces) == 1
    assert "hi from the child" in announces[0]["content"]
    assert f"sessionId {session_id}" in announces[0]["content"]
    spawn = services.store.spawns.get(spawn_id)
    assert spawn is not None and spawn.get("status") == "done"
