"""Pure parts of collector spawns and `agents_wait`: reading a child's answer against its
`outputSchema`, the reported status, the tool's ids and result shape (no Redis)."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.shared.errors import InvalidInput
from switchboard.shared.flows.collect import (
    NOT_JSON,
    completion_fields,
    parse_answer,
    schema_problem,
    validate_answer,
)
from switchboard.shared.policy.tool_policy import ToolInfo, allowed_tools
from switchboard.shared.store.collect import WaitRead
from switchboard.shared.store.spawns import SpawnRecord
from switchboard.shared.tools.agents_wait import read_ids, result_of

pytestmark = pytest.mark.unit

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def spawn(**fields: Any) -> SpawnRecord:
    return SpawnRecord(id="s1", fields=fields)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"n": 1}', {"n": 1}),
        ("  [1, 2]\n", [1, 2]),
        ("42", 42),
        ('Here:\n```json\n{"n": 2}\n```\nthanks', {"n": 2}),
        ('```\n{"n": 3}\n```', {"n": 3}),
        ('```json\nnot json\n```\n```json\n{"n": 4}\n```', {"n": 4}),
    ],
)
def test_answers_are_json_or_hold_a_fenced_block(text: str, value: Any) -> None:
    assert parse_answer(text) == (True, value)


@pytest.mark.parametrize("text", ["", "four", "```json\n{oops}\n```", "{'n': 1}"])
def test_prose_is_not_json(text: str) -> None:
    assert parse_answer(text) == (False, None)


def test_validation_names_the_first_problem_and_where() -> None:
    assert validate_answer('{"n": 5}', SCHEMA) == ({"n": 5}, None)
    assert validate_answer('{"n": "5"}', SCHEMA) == (None, "'5' is not of type 'integer' (at n)")
    assert validate_answer("{}", SCHEMA) == (None, "'n' is a required property")
    assert validate_answer("five", SCHEMA) == (None, NOT_JSON)
    assert validate_answer("null", {"type": "null"}) == (None, None)  # null is a value


def test_schemas_are_checked_against_their_metaschema() -> None:
    assert schema_problem(SCHEMA) is None
    assert schema_problem({"$schema": "http://json-schema.org/draft-07/schema#"}) is None
    assert schema_problem([1]) == "outputSchema must be a JSON Schema object"
    problem = schema_problem({"type": "nope"})
    assert problem is not None and problem.startswith("outputSchema is not a valid JSON Schema")
    nested = schema_problem({"properties": {"n": {"minimum": "x"}}})
    assert nested is not None and "(at properties/n/minimum)" in nested


def test_completion_status_comes_from_the_runtime_outcome() -> None:
    ok = completion_fields(spawn(outcome="ok", result='{"n": 1}', usage={"input": 7}), SCHEMA)
    assert ok == {
        "status": "done",
        "result": '{"n": 1}',
        "usage": {"inputTokens": 7, "outputTokens": 0},
        "structured": {"n": 1},
    }
    failed = completion_fields(spawn(outcome="error", error="boom", result="partial"), SCHEMA)
    assert failed == {"status": "failed", "result": "partial", "error": "boom"}  # no schema check
    assert completion_fields(spawn(outcome="timeout"), None)["status"] == "timeout"
    assert completion_fields(spawn(outcome="cancelled"), None)["status"] == "killed"
    assert completion_fields(spawn(outcome="lost"), None)["status"] == "failed"
    plain = completion_fields(spawn(outcome="ok", result="prose"), None)
    assert plain == {"status": "done", "result": "prose"}


def test_ids_are_trimmed_deduplicated_and_bounded() -> None:
    assert read_ids({"ids": [" a ", "b", "a", ""]}) == ["a", "b"]
    for bad in ({}, {"ids": []}, {"ids": "a"}, {"ids": [1]}, {"ids": ["  "]}):
        with pytest.raises(InvalidInput):
            read_ids(bad)
    assert len(read_ids({"ids": [str(i) for i in range(1000)]})) == 1000
    with pytest.raises(InvalidInput, match="at most 1000"):
        read_ids({"ids": [str(i) for i in range(1001)]})


def test_result_orders_by_completion_and_flags_total_failure() -> None:
    def done(seq: str, **extra: Any) -> dict[str, Any]:
        return {"status": "done", "result": "r", "childKey": "k", "completedSeq": seq, **extra}

    read = WaitRead(
        found={
            "late": done("1700000000001-0"),
            "p": "pending",
            "early": done("1700000000000-5", label="L", structured=None),
            "same-ms": done("1700000000001-1", schemaError="bad"),
            "x": "not_owner",
        },
        token=None,
    )
    out = result_of(["late", "p", "early", "same-ms", "x"], read)
    assert [c["runId"] for c in out["completed"]] == ["early", "late", "same-ms"]
    assert out["completed"][0] == {
        "runId": "early",
        "status": "done",
        "result": "r",
        "structured": None,
        "sessionKey": "k",
        "label": "L",
    }
    assert out["completed"][2]["schemaError"] == "bad"
    assert out["pending"] == ["p"]
    assert out["errors"] == [{"runId": "x", "error": "not_found"}] and "success" not in out
    gone = result_of(["a"], WaitRead(found={"a": "not_found"}, token=None))
    assert gone == {
        "completed": [],
        "pending": [],
        "errors": [{"runId": "a", "error": "not_found"}],
        "success": False,
    }


def test_orchestrators_keep_agents_wait_leaves_do_not() -> None:
    tools = [ToolInfo("agents_wait", session_tool=True), ToolInfo("sessions_send", True)]
    assert allowed_tools("orchestrator", tools) == ["agents_wait"]
    assert allowed_tools("leaf", tools) == []
    assert allowed_tools("main", tools) == ["agents_wait", "sessions_send"]
