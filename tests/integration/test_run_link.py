"""A run names itself on its flow as it is recorded (`NewRun.link`), spawn's pipelined start
(`RunStore.start_in`), `Flow.with_fields` against a real `advance`, and clearing several
outbox entries at once."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from switchboard.shared.flows.a2a_flow import advance, create_flow, load_flow
from switchboard.shared.gateway.agent import RunRequest, start_run
from switchboard.shared.services import Services
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.runs import LinkAdvance, LinkMoved, NewRun, now_ms
from switchboard_testkit import store_reads

pytestmark = pytest.mark.integration

FLOW = "test-link-hash"  # a plain hash standing in for a flow


def _rid(name: str, key: str) -> str:
    """The id of the run a test calls ``name`` in session ``key`` (in its slot group)."""
    return store_reads.id_beside(key, name)


def _new_run(
    name: str,
    key: str,
    *,
    link: tuple[str, str] | None = None,
    on_end: dict[str, Any] | None = None,
) -> NewRun:
    return NewRun(
        run_id=_rid(name, key),
        session_key=key,
        message={"role": "user", "content": "hi", "timestamp": 1},
        timeout_s=30,
        link=link,
        on_end=on_end,
    )


def _field(services: Services, name: str) -> str | None:
    value = services.store.redis.hget(FLOW, name)
    return as_text(value) if value is not None else None


# ---- RunStore.start ------------------------------------------------------------------------


def test_a_started_run_names_itself_in_its_link(services: Services) -> None:
    """(a) The start script writes the new run's id into the link's hash field."""
    started = services.store.runs.start(
        _new_run("run-a", "agent:main:link-a", link=(FLOW, "run:0")), on_create={}
    )
    assert started.took_lane and started.existing_run_id is None
    assert _field(services, "run:0") == _rid("run-a", "agent:main:link-a")
    assert services.store.runs.get(_rid("run-a", "agent:main:link-a")) is not None


def test_the_first_run_linked_stays_linked(services: Services) -> None:
    """(b) A second run started with the same link leaves the first run's id there."""
    runs = services.store.runs
    runs.start(_new_run("run-1", "agent:main:link-b", link=(FLOW, "run:1")), on_create={})
    second = runs.start(_new_run("run-2", "agent:main:link-b", link=(FLOW, "run:1")))
    assert runs.get(_rid("run-2", "agent:main:link-b")) is not None  # recorded,
    assert not second.took_lane  # queued
    assert _field(services, "run:1") == _rid("run-1", "agent:main:link-b")


def test_a_duplicate_links_the_run_its_idempotency_key_names(services: Services) -> None:
    """(c) A start whose idempotency key names an earlier run records nothing new and links
    that earlier run into an unset field."""
    runs, key = services.store.runs, "agent:main:link-c"
    runs.start(_new_run("run-x", key, link=(FLOW, "run:0")), idempotency_key="idem")
    again = runs.start(_new_run("run-y", key, link=(FLOW, "announceRunId")), idempotency_key="idem")
    assert again.existing_run_id == _rid("run-x", key)
    assert runs.get(_rid("run-y", key)) is None
    assert _field(services, "announceRunId") == _rid("run-x", key)
    assert _field(services, "run:0") == _rid("run-x", key)


def test_start_in_records_the_run_in_a_pipeline(services: Services) -> None:
    """(d) `start_in` queues the start script in a pipeline: the session is created, the
    run recorded holding its lane (reply `[1, sessionId, 'lane', '']`), and linked."""
    runs, key = services.store.runs, "agent:main:link-d"
    flow = services.store.ks.flow(store_reads.id_beside(key, "flow-d"))  # in the run's slot
    pipe = services.store.redis.pipeline(transaction=False)
    runs.start_in(
        pipe,
        _new_run("run-p", key, link=(flow, "run:0")),
        on_create={"chatType": "direct"},
        now=now_ms(),
    )
    (reply,) = pipe.execute()
    entry = services.store.sessions.get(key)
    assert entry is not None and entry.get("chatType") == "direct"
    assert int(reply[0]) == 1 and as_text(reply[1]) == entry.session_id
    assert as_text(reply[2]) == "lane"
    rec = runs.get(_rid("run-p", key))
    assert rec is not None and rec.status == "queued"
    assert runs.lane_holder(key) == _rid("run-p", key)
    assert as_text(services.store.redis.hget(flow, "run:0")) == _rid("run-p", key)


# ---- start_run's label / route branch ------------------------------------------------------


@pytest.mark.parametrize(
    "route",
    [{"label": "linked-label"}, {"channel": "relay", "to": "group:room9"}],
    ids=["label", "route"],
)
def test_start_run_links_the_run_on_its_label_or_route_branch(
    services: Services, route: dict[str, str]
) -> None:
    """(e) A request with a label or a delivery route (started in separate steps, not the
    start script) links its run too, and a duplicate links the run its key names."""
    key = "agent:main:link-e"
    first = start_run(
        services,
        RunRequest(
            session_key=key, message="hi", idempotency_key="k", link=(FLOW, "run:0"), **route
        ),
    )
    assert _field(services, "run:0") == first["runId"]
    assert services.store.runs.get(first["runId"]) is not None
    again = start_run(
        services,
        RunRequest(
            session_key=key,
            message="hi",
            idempotency_key="k",
            link=(FLOW, "announceRunId"),
            **route,
        ),
    )
    assert again["deduplicated"] and again["runId"] == first["runId"]
    assert _field(services, "announceRunId") == first["runId"]


# ---- a link advance: the link's hash moved on in the run's start ---------------------------


def _advance_to_announcing(turn: str = "0") -> LinkAdvance:
    return LinkAdvance(
        status="running",
        turn=turn,
        fields={"status": "announcing", "stopReason": "max_turns", "skipReason": None},
        ttl_s=600,
    )


@pytest.mark.parametrize("route", [{}, {"label": "advance-label"}], ids=["script", "label"])
def test_a_link_advance_moves_the_hash_on_and_records_the_run(
    services: Services, route: dict[str, str]
) -> None:
    """(j) Where the hash is as expected, its fields are written (a None value removed),
    its TTL set, and the run recorded and linked, on the start script and on the label
    branch's separate steps alike."""
    services.store.redis.hset(FLOW, mapping={"status": "running", "turn": "0", "skipReason": "x"})
    started = start_run(
        services,
        RunRequest(
            session_key="agent:main:link-j",
            message="hi",
            link=(FLOW, "announceRunId"),
            link_advance=_advance_to_announcing(),
            **route,  # type: ignore[arg-type]
        ),
    )
    assert services.store.runs.get(started["runId"]) is not None
    assert _field(services, "announceRunId") == started["runId"]
    assert _field(services, "status") == "announcing"
    assert _field(services, "stopReason") == "max_turns"
    assert _field(services, "skipReason") is None
    assert 0 < services.store.redis.ttl(FLOW) <= 600


@pytest.mark.parametrize("route", [{}, {"label": "moved-label"}], ids=["script", "label"])
@pytest.mark.parametrize(
    "stored", [{"status": "announcing", "turn": "0"}, {"status": "running", "turn": "1"}]
)
def test_a_link_advance_on_a_hash_that_moved_on_records_nothing(
    services: Services, route: dict[str, str], stored: dict[str, str]
) -> None:
    """(k) Where the hash shows another status or turn, `LinkMoved` is raised and nothing
    is written: no field, no run, no session entry, nothing queued."""
    services.store.redis.hset(FLOW, mapping=stored)
    key = "agent:main:link-k"
    runs_before = services.store.redis.keys(services.store.ks.run("*"))
    with pytest.raises(LinkMoved):
        start_run(
            services,
            RunRequest(
                session_key=key,
                message="hi",
                link=(FLOW, "announceRunId"),
                link_advance=_advance_to_announcing(),
                **route,  # type: ignore[arg-type]
            ),
        )
    assert {as_text(k): as_text(v) for k, v in services.store.redis.hgetall(FLOW).items()} == stored
    assert services.store.redis.keys(services.store.ks.run("*")) == runs_before
    assert services.store.sessions.get(key) is None
    assert services.store.runs.lane_holder(key) is None


# ---- a link record: the flow written in its first run's start ------------------------------


def _flow_args(target: str) -> dict[str, Any]:
    return {
        "requester_key": "agent:main:main",
        "requester_channel": "webchat",
        "target_key": target,
        "target_display": target,
        "message": "hello",
        "max_turns": 1,
        "skip_reason": None,
    }


def _start_linked(
    services: Services, target: str, flow_id: str, record: Any, **route: str
) -> dict[str, Any]:
    """Start a run in ``target`` that writes the flow ``record`` and names itself `run:0`."""
    return start_run(
        services,
        RunRequest(
            session_key=target,
            message="hi",
            link=(services.store.ks.flow(flow_id), "run:0"),
            link_record=record,
            **route,  # type: ignore[arg-type]
        ),
    )


def _flow_state(services: Services, flow_id: str, target: str) -> dict[str, Any]:
    """The flow hash, its TTL and its score in both sessions' flow indexes."""
    r, ks = services.store.redis, services.store.ks
    return {
        "fields": {as_text(k): as_text(v) for k, v in r.hgetall(ks.flow(flow_id)).items()},
        "ttl": r.ttl(ks.flow(flow_id)),
        "indexed": [
            r.zscore(ks.session_flows(key), flow_id) for key in ("agent:main:main", target)
        ],
        "index_ttl": [r.ttl(ks.session_flows(key)) for key in ("agent:main:main", target)],
    }


@pytest.mark.parametrize("route", [{}, {"label": "flow-label"}], ids=["script", "label"])
def test_a_link_record_is_written_as_create_flow_writes_it(
    services: Services, route: dict[str, str]
) -> None:
    """(g) A flow handed to `start_run` as a link record is stored with the run, linked,
    exactly as `create_flow` stores a flow on its own: fields, TTL, both sessions'
    indexes (on the start script and on the label branch's separate steps)."""
    from switchboard.shared.flows.a2a_flow import new_flow

    target = "agent:main:link-g"
    flow_id, record = new_flow(services, **_flow_args(target))
    started = _start_linked(services, target, flow_id, record, **route)
    alone = create_flow(services, **_flow_args("agent:main:link-g2"))
    mine = _flow_state(services, flow_id, target)
    theirs = _flow_state(services, alone, "agent:main:link-g2")
    assert mine["fields"].pop("run:0") == started["runId"]
    for state, fid in ((mine, flow_id), (theirs, alone)):
        assert state["fields"].pop("flowId") == fid
        state["fields"].pop("targetKey"), state["fields"].pop("targetDisplay")
        state["fields"].pop("createdAt"), state["fields"].pop("updatedAt")
    assert (
        mine["fields"]
        == theirs["fields"]
        == {
            "status": "running",
            "turn": "0",
            "requesterKey": "agent:main:main",
            "requesterChannel": "webchat",
            "message": "hello",
            "maxTurns": "1",
        }
    )
    for state in (mine, theirs):
        assert 0 < state["ttl"] <= record.ttl_s
        assert all(score is not None for score in state["indexed"])
        assert all(0 < ttl <= record.ttl_s for ttl in state["index_ttl"])


def test_a_refused_start_writes_no_link_record(services: Services) -> None:
    """(h) A start refused before anything is recorded (an empty message) leaves no flow."""
    from switchboard.shared.errors import InvalidInput
    from switchboard.shared.flows.a2a_flow import new_flow

    flow_id, record = new_flow(services, **_flow_args("agent:main:link-h"))
    with pytest.raises(InvalidInput):
        start_run(
            services,
            RunRequest(
                session_key="agent:main:link-h",
                message="  ",
                link=(services.store.ks.flow(flow_id), "run:0"),
                link_record=record,
            ),
        )
    assert load_flow(services, flow_id) is None
    assert services.store.redis.exists(services.store.ks.session_flows("agent:main:main")) == 0


@pytest.mark.parametrize("trims", [True, False])
def test_the_link_record_trims_old_index_entries(services: Services, trims: bool) -> None:
    """(i) Index members scored at or below the record's trim score are dropped by a
    record that trims (trim_to > 0), kept by one that does not (trim_to 0)."""
    from switchboard.shared.flows.a2a_flow import new_flow

    target = "agent:main:link-i"
    index = services.store.ks.session_flows(target)
    flow_id, record = new_flow(services, **_flow_args(target))
    cut = record.score - record.ttl_s * 1000
    record = replace(record, trim_to=cut if trims else 0)
    services.store.redis.zadd(index, {"old-flow": cut, "newer": cut + 1})
    _start_linked(services, target, flow_id, record)
    members = {as_text(m) for m in services.store.redis.zrange(index, 0, -1)}
    assert members == ({"newer", flow_id} if trims else {"old-flow", "newer", flow_id})
    assert 0 < services.store.redis.ttl(index) <= record.ttl_s


def test_one_flow_in_16_trims_its_indexes(services: Services) -> None:
    """(i) A new flow's record trims its indexes when its id ends in 0 (one in 16)."""
    from switchboard.shared.flows.a2a_flow import new_flow

    seen = set()
    while len(seen) < 2:  # till both kinds came (one in 16 trims)
        flow_id, record = new_flow(services, **_flow_args("agent:main:link-j"))
        assert (record.trim_to > 0) == flow_id.endswith("0")
        if record.trim_to:
            assert record.trim_to == record.score - record.ttl_s * 1000
        seen.add(record.trim_to > 0)


# ---- Flow.with_fields against advance ------------------------------------------------------


def test_with_fields_is_the_flow_advance_stores(services: Services) -> None:
    """(f) `with_fields(fields)` equals what `load_flow` reads after `advance(fields)`,
    `updatedAt` aside: ints, dicts, a removed field and the fields left alone."""
    flow_id = create_flow(
        services,
        requester_key="agent:main:main",
        requester_channel="webchat",
        target_key="agent:main:hook:t",
        target_display="hook:t",
        message="hello",
        max_turns=2,
        skip_reason="disabled",
    )
    flow = load_flow(services, flow_id)
    assert flow is not None
    fields: dict[str, Any] = {
        "round:0": {"turn": 0, "status": "ok", "reply": "hi", "nested": {"a": [1, 2]}},
        "turn": 1,
        "status": "announcing",
        "skipReason": None,
        "announceTarget": None,
        "latestReply": "hi",
    }
    expected = flow.with_fields(fields)
    assert advance(services, flow, fields)
    stored = load_flow(services, flow_id)
    assert stored is not None
    without_time = {k: v for k, v in stored.fields.items() if k != "updatedAt"}
    assert {k: v for k, v in expected.fields.items() if k != "updatedAt"} == without_time
    assert "skipReason" not in stored.fields


# ---- the outbox ----------------------------------------------------------------------------


def test_outbox_done_clears_several_runs_at_once(services: Services) -> None:
    """`outbox_done(*run_ids)` removes every run named, and only those."""
    runs = services.store.runs
    ids = []
    for name in ("run-o1", "run-o2", "run-o3"):
        key = f"agent:main:{name}"
        run_id = _rid(name, key)
        ids.append(run_id)
        runs.start(_new_run(name, key, on_end={"task": "test.none", "args": []}))
        claim = runs.claim(run_id, key)
        assert not isinstance(claim, str)
        assert runs.finish(run_id, key, claim.attempt, status="ok", reply="x").applied
    far = now_ms() + 3_600_000
    assert sorted(runs.outbox_due(far)) == sorted(ids)
    runs.outbox_done(ids[0], ids[2])
    assert runs.outbox_due(far) == [ids[1]]
