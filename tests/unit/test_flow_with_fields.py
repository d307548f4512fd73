"""`Flow.with_fields`: the flow as `advance` stores it, built without reading it again."""

from __future__ import annotations

import json

import pytest

from switchboard.shared.flows.a2a_flow import Flow

pytestmark = pytest.mark.unit


@pytest.fixture
def flow() -> Flow:
    """A running flow at turn 0, as `load_flow` decodes one."""
    return Flow(
        "flow-1",
        {
            "flowId": "flow-1",
            "status": "running",
            "turn": "0",
            "targetKey": "agent:main:hook:t",
            "skipReason": "disabled",
            "message": "hello",
        },
    )


def test_values_are_encoded_as_advance_stores_them(flow: Flow) -> None:
    """Ints and bools become text, dicts compact JSON, strings stay as they are."""
    after = flow.with_fields(
        {
            "turn": 1,
            "status": "announcing",
            "round:0": {"turn": 0, "status": "ok", "reply": "hi"},
            "flag": True,
        }
    )
    assert after.fields["turn"] == "1" and after.turn == 1
    assert after.status == "announcing"
    assert after.fields["round:0"] == '{"turn":0,"status":"ok","reply":"hi"}'
    assert json.loads(after.fields["round:0"]) == {"turn": 0, "status": "ok", "reply": "hi"}
    assert after.fields["flag"] == "1"


def test_a_none_value_removes_the_field(flow: Flow) -> None:
    """None removes a field that was set, and adds nothing for a field that was not."""
    after = flow.with_fields({"skipReason": None, "announceRunId": None})
    assert "skipReason" not in after.fields
    assert "announceRunId" not in after.fields
    assert after.get("skipReason") is None


def test_fields_not_written_are_kept(flow: Flow) -> None:
    """Fields absent from the write keep their values; the flow keeps its id."""
    after = flow.with_fields({"status": "announcing"})
    assert after.flow_id == "flow-1"
    assert after.fields == {**flow.fields, "status": "announcing"}
    assert after.target_key == "agent:main:hook:t"


def test_the_original_flow_is_unchanged(flow: Flow) -> None:
    """The flow it is called on is not modified: a new Flow is answered."""
    before = dict(flow.fields)
    after = flow.with_fields({"status": "done", "skipReason": None, "turn": 3})
    assert after is not flow
    assert dict(flow.fields) == before
    assert flow.status == "running" and flow.get("skipReason") == "disabled"
