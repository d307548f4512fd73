"""The store cut into slot groups (SWITCHBOARD_SLOT_GROUPS=8, the slot check on) on a real
Redis and a real worker: a session's records sit in its group and a sub-agent in its
requester's; a send between sessions of two groups runs its reply-back rounds and its
announce, each step on one slot, and survives a death between the two steps of a round's
start; a run parks on a run of another group and is woken by its end; a process cut into
other groups refuses to start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from switchboard.shared.config import ConfigError, Settings
from switchboard.shared.flows import pending
from switchboard.shared.flows.a2a_flow import get_flow
from switchboard.shared.services import Services
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.runs import RunStore
from switchboard.wiring import build_services
from switchboard_testkit.queues import RecordingQueue
from switchboard_testkit.sse import Sse, sse_events, until

pytestmark = pytest.mark.integration

GROUPS = 8
_KS = Keyspace("sb:", GROUPS)


def _in_group(group: int, stem: str) -> str:
    """A session key of ``stem`` that falls in slot group ``group``."""
    return next(
        key
        for key in (f"agent:main:hook:{stem}-{i}" for i in range(1000))
        if _KS.group_of_key(key) == group
    )


REQUESTER = _in_group(1, "requester")
TARGET = _in_group(6, "target")


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The integration settings, cut into 8 slot groups with the slot check on (a step
    that names keys of two slots raises `CrossSlotError`)."""
    return settings.model_copy(update={"slot_groups": GROUPS, "slot_check": True})


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Two reply-back rounds; every session of the agent visible to its others."""
    return {
        "tools": {"sessions": {"visibility": "agent"}},
        "session": {"agentToAgent": {"maxPingPongTurns": 2}},
    }


def _invoke(client: httpx.Client, session_key: str, tool: str, **args: Any) -> dict[str, Any]:
    resp = client.post(
        "/tools/invoke", json={"tool": tool, "args": args, "sessionKey": session_key}
    )
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def _done_flow(services: Services, flow_id: str, timeout_s: float = 45) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        flow = get_flow(services, flow_id)
        assert flow is not None
        if flow["status"] == "done":
            return flow
        assert time.monotonic() < deadline, f"flow not done: {flow}"
        time.sleep(0.1)


def _group_of(services: Services, redis_key: str) -> int:
    return services.store.ks.group_of(redis_key)


def test_records_sit_in_their_sessions_group_and_children_in_their_requesters(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A run's hash and lane are in its session's group; a spawned child's session, run
    and spawn record in its requester's, whatever group its own key would hash to."""
    ks = services.store.ks
    assert ks.groups == GROUPS and ks.group_of_key(REQUESTER) != ks.group_of_key(TARGET)
    run_id = _invoke(client, TARGET, "sessions_send", sessionKey=REQUESTER, message="hi")["runId"]
    assert ks.group_of_id(run_id) == ks.group_of_key(REQUESTER)
    spawned = _invoke(client, REQUESTER, "sessions_spawn", task="say child")
    child = spawned["childSessionKey"]
    spawn_id = str(services.store.runs.get(spawned["runId"]).meta["spawnId"])  # type: ignore[union-attr]
    for redis_key in (ks.session(child), ks.run(spawned["runId"]), ks.spawn(spawn_id)):
        assert _group_of(services, redis_key) == ks.group_of_key(REQUESTER), redis_key
    deadline = time.monotonic() + 30
    while (spawn := services.store.spawns.get(spawn_id)) is None or spawn.get("announce") not in (
        "delivered",
        "skipped",
    ):
        assert time.monotonic() < deadline, spawn
        time.sleep(0.1)
    texts = [str(m["content"]) for m in services.store.transcripts.all(REQUESTER)]
    assert sum("say child" in t for t in texts) >= 1  # the announce landed, in one step


def test_a_send_between_two_groups_runs_its_rounds_and_announce(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """Target's run, the requester's round (started in its group, named on the flow in
    the target's), the target's round and the announce: each run in its speaker's group,
    the flow in the target's, listed in both sessions' flow indexes."""
    ks = services.store.ks
    sent = _invoke(
        client, REQUESTER, "sessions_send", sessionKey=TARGET, message="ping", timeoutSeconds=20
    )
    assert sent["status"] == "ok" and sent["reply"] == "ping", sent
    flow = _done_flow(services, sent["flowId"])
    speakers = [(r["turn"], r["sessionKey"], r["status"]) for r in flow["rounds"]]
    assert speakers == [(0, TARGET, "ok"), (1, REQUESTER, "ok"), (2, TARGET, "ok")]
    for record in flow["rounds"]:
        assert ks.group_of_id(record["runId"]) == ks.group_of_key(record["sessionKey"])
    assert _group_of(services, ks.flow(sent["flowId"])) == ks.group_of_key(TARGET)
    announce = services.store.runs.get(flow["announce"]["runId"])
    assert announce is not None and announce.session_key == TARGET  # no route: not delivered
    assert ks.group_of_id(announce.run_id) == ks.group_of_key(TARGET)
    for session in (REQUESTER, TARGET):
        assert sent["flowId"] in services.store.flows.recent_ids(session, 10)


def test_a_round_whose_start_died_before_its_naming_is_named_when_its_step_runs_again(
    worker: Any,
    client: httpx.Client,
    services: Services,
    sweeper: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The requester's round is recorded in its group, then named on the flow in the
    target's: a worker that dies between the two (here: the naming raises once) leaves the
    flow without its round's run; the step, run again by the sweep, names the same run
    (its idempotency key), and the flow ends with one run per round."""
    real = RunStore.name_link
    real_done = pending.mark_done
    died: list[tuple[str, str]] = []
    dead_threads: set[int] = set()

    def dies_once(self: RunStore, link: tuple[str, str], run_id: str) -> None:
        if not died and link[1] == "run:1":
            died.append(link)
            dead_threads.add(threading.get_ident())
            raise RuntimeError("worker died between the round's start and its naming")
        real(self, link, run_id)

    def not_by_the_dead(svc: Services, task: str, args: Any, started: int | None) -> None:
        # A dead worker records nothing after its death: a step it ran as a message (the
        # plain path) is not marked done as a failed step is, so the sweep takes it again.
        if threading.get_ident() in dead_threads:
            dead_threads.discard(threading.get_ident())
            return
        real_done(svc, task, args, started)

    monkeypatch.setattr(RunStore, "name_link", dies_once)
    monkeypatch.setattr(pending, "mark_done", not_by_the_dead)
    sent = _invoke(
        client, REQUESTER, "sessions_send", sessionKey=TARGET, message="pong", timeoutSeconds=0
    )
    flow = _done_flow(services, sent["flowId"], timeout_s=60)
    assert died, "the naming never ran"
    assert [(r["turn"], r["status"]) for r in flow["rounds"]] == [(0, "ok"), (1, "ok"), (2, "ok")]
    rounds = [r for r in _runs_of_flow(services, sent["flowId"]) if r.meta.get("a2a") == "reply"]
    assert sorted((r.session_key, r.meta.get("turn")) for r in rounds) == [
        (REQUESTER, 1),
        (TARGET, 2),
    ]  # one run per round: the step run again found the round's run by its key
    assert {r.run_id for r in rounds} == {flow["rounds"][1]["runId"], flow["rounds"][2]["runId"]}


def _runs_of_flow(services: Services, flow_id: str) -> list[Any]:
    """Every run recorded for a flow, in every slot group."""
    ids = []
    for group in services.store.ks.every_group():
        head = f"{group.prefix}r:"
        for key in services.store.redis.scan_iter(f"{head}*", count=1000):
            name = key.decode()[len(head) :]
            if not name.endswith(":waiters"):
                ids.append(name)
    found = services.store.runs.get_many(ids)
    return [r for r in found if r is not None and r.meta.get("flowId") == flow_id]


def test_a_run_parks_on_a_run_of_another_group_and_its_end_wakes_it(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """A waiting sessions_send inside a run parks it (its group) and registers it on the
    target's run (the other group) after the park; the target's end resumes it."""
    ks = services.store.ks
    call = {"sessionKey": TARGET, "message": "/sleep 1.5\nfrom afar", "timeoutSeconds": 20}
    caller = rpc("agent", sessionKey=REQUESTER, message="/tool sessions_send " + json.dumps(call))
    deadline = time.monotonic() + 15
    while (rec := services.store.runs.get(caller["runId"])) is None or rec.status != "parked":
        assert time.monotonic() < deadline, f"the caller never parked: {rec}"
        time.sleep(0.05)
    (target_run,) = [str(c["targetRunId"]) for c in rec.parked]
    assert ks.group_of_id(target_run) == ks.group_of_key(TARGET)
    waiters = services.store.redis.smembers(ks.run_waiters(target_run))
    assert caller["runId"].encode() in waiters  # registered across the groups
    outcome = rpc("agent.wait", runId=caller["runId"], timeoutMs=30_000)
    assert outcome["status"] == "ok", outcome
    assert json.loads(outcome["reply"])["reply"] == "from afar"


def test_events_of_every_group_come_in_one_stream_and_resume_by_id(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """`/events` follows every group's stream as one: two sessions' runs in two groups
    arrive merged, ids `<ms>-<seq>-<group>` in increasing order, and a Last-Event-ID
    resumes after that event in every group."""
    ks = services.store.ks
    runs = []
    for session in (REQUESTER, TARGET, REQUESTER):
        run_id = rpc("agent", sessionKey=session, message=f"hi {session}")["runId"]
        rpc("agent.wait", runId=run_id, timeoutMs=20_000)
        runs.append(run_id)

    def ended(run_id: str) -> Callable[[Sse], bool]:
        return lambda ev: ev.event == "run.ended" and ev.data.get("runId") == run_id

    with client.stream("GET", "/events", headers={"Last-Event-ID": "0-0"}) as resp:
        seen = [ev for ev in until(sse_events(resp), ended(runs[-1])) if ev.id]
    mine = [ev for ev in seen if ev.data.get("runId") in runs]
    assert [(ev.event, ev.data["runId"]) for ev in mine] == [
        (kind, run_id) for run_id in runs for kind in ("run.started", "run.ended")
    ]
    order = [tuple(int(p) for p in str(ev.id).split("-")) for ev in seen]
    assert order == sorted(order) and len(set(order)) == len(order)
    groups = {int(str(ev.id).rsplit("-", 1)[1]) for ev in mine}
    assert groups == {ks.group_of_key(REQUESTER), ks.group_of_key(TARGET)}
    first_end = next(ev for ev in mine if ended(runs[0])(ev))
    with client.stream("GET", "/events", headers={"Last-Event-ID": str(first_end.id)}) as resp:
        resumed = [ev for ev in until(sse_events(resp), ended(runs[-1])) if ev.id]
    later = [ev for ev in seen if ev.id and order[seen.index(ev)] > order[seen.index(first_end)]]
    assert [ev.id for ev in resumed][1:] == [ev.id for ev in later]  # after `ready`


def test_a_process_cut_into_other_groups_refuses_to_start(
    services: Services, settings: Settings
) -> None:
    """The first process records the store's slot groups; one cut otherwise stops at
    start naming the setting (it would not find what the others write)."""
    assert services.store.layout_groups() == GROUPS
    other = settings.model_copy(update={"slot_groups": 4})
    with pytest.raises(ConfigError, match="SWITCHBOARD_SLOT_GROUPS=8"):
        build_services(other, queue=RecordingQueue())


def test_a_store_holding_one_groups_data_is_not_cut_into_more(
    redis_url: str, settings: Settings
) -> None:
    """A store with sessions written before slot groups were recorded (one group: a
    cluster's one-slot store, or one Redis) is taken as cut into one group: a process cut
    into 8 refuses to start instead of starting on an empty keyspace beside the data."""
    with redis.Redis.from_url(redis_url) as admin:
        admin.zadd("sb:idx:upd", {"agent:main:main": 1})  # as one group's store keeps it
    with pytest.raises(ConfigError, match="SWITCHBOARD_SLOT_GROUPS=1"):
        build_services(settings, queue=RecordingQueue())


@pytest.mark.parametrize("command", [["worker"], ["beat"], ["api", "--port", "0"]])
def test_a_process_command_cut_otherwise_stops_at_start_with_one_line(
    redis_url: str, tmp_path: Any, command: list[str]
) -> None:
    """`switchboard api|worker|beat` on a store recorded as cut into 8 groups, itself cut
    into 4: one line naming the setting on stderr, exit 2, before it serves anything."""
    with redis.Redis.from_url(redis_url) as admin:
        admin.hset(_KS.layout, "groups", GROUPS)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")},
        "SWITCHBOARD_REDIS_URL": redis_url,
        "SWITCHBOARD_TOKEN": "t",
        "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
        "SWITCHBOARD_SLOT_GROUPS": "4",
    }
    done = subprocess.run(
        [sys.executable, "-m", "switchboard", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "SWITCHBOARD_SLOT_GROUPS=8" in lines[0], done.stderr
