"""Deeply nested input is a 400 that says the limit, on every surface, never a 500 or
Python exception text (bodies: `MAX_JSON_DEPTH`; outputSchema: `MAX_SCHEMA_DEPTH`)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from switchboard.api.limits import MAX_JSON_DEPTH
from switchboard.shared.flows.collect import MAX_SCHEMA_DEPTH

pytestmark = pytest.mark.integration

EXCEPTION_TEXT = ("Traceback", "RecursionError", "maximum recursion", "Error(", "line 1 column")


def nested_schema(levels: int) -> dict[str, Any]:
    """An object schema ``levels`` properties deep."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def nested_list(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def spawn_with(client: httpx.Client, schema: Any) -> httpx.Response:
    body = {
        "tool": "sessions_spawn",
        "args": {"task": "x", "collect": True, "outputSchema": schema},
    }
    return client.post("/tools/invoke", content=json.dumps(body))


def assert_plain_400(resp: httpx.Response, says: str) -> None:
    assert resp.status_code == 400, (resp.status_code, resp.text[:300])
    assert says in resp.text, resp.text[:300]
    for text in EXCEPTION_TEXT:
        assert text not in resp.text, resp.text[:300]


def test_a_150_level_output_schema_is_a_400_naming_the_limit(client: httpx.Client) -> None:
    """The 150-level schema that was a 500 (RecursionError) is a 400 saying the body limit."""
    assert_plain_400(spawn_with(client, nested_schema(150)), f"deeper than {MAX_JSON_DEPTH}")


def test_an_output_schema_past_its_own_limit_is_a_400(client: httpx.Client) -> None:
    """A schema within the body limit but past the schema limit: 400 naming that limit."""
    resp = spawn_with(client, nested_schema(MAX_SCHEMA_DEPTH // 2 + 1))
    assert_plain_400(resp, f"outputSchema nests deeper than {MAX_SCHEMA_DEPTH} levels")


def test_deep_bodies_are_400_on_every_surface(client: httpx.Client) -> None:
    """/rpc, /tools/invoke, /v1/chat/completions, /mcp and A2A refuse a 150-deep body
    with a 400 saying the limit; one level under the limit is not refused for depth."""
    deep = nested_list(150)
    bodies = {
        "/rpc": {"method": "sessions.list", "params": {"x": deep}},
        "/tools/invoke": {"tool": "sessions_list", "args": {"x": deep}},
        "/v1/chat/completions": {"model": "main", "messages": deep},
        "/mcp/": {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": deep},
        "/a2a/main": {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": deep},
    }
    for path, body in bodies.items():
        resp = client.post(path, content=json.dumps(body))
        assert_plain_400(resp, f"deeper than {MAX_JSON_DEPTH} levels")
    shallow = {"method": "sessions.list", "params": {"x": nested_list(MAX_JSON_DEPTH - 3)}}
    resp = client.post("/rpc", content=json.dumps(shallow))
    assert f"deeper than {MAX_JSON_DEPTH}" not in resp.text


def test_a2a_answers_no_exception_text(client: httpx.Client) -> None:
    """A2A's answers to an unparsable body and to params of the wrong shape carry a
    fixed sentence, not the parser's exception text."""
    headers = {"A2A-Version": "1.0", "Content-Type": "application/json"}
    not_json = client.post("/a2a/main", content=b"{not json", headers=headers)
    error = not_json.json()["error"]
    assert error == {"code": -32700, "message": "invalid JSON payload"}
    bad_params = client.post(
        "/a2a/main",
        json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": {"x": [1]}}},
        headers=headers,
    )
    error = bad_params.json()["error"]
    assert error["code"] == -32602 and "data" not in error, error
    for text in (*EXCEPTION_TEXT, "parseError", "Failed to parse"):
        assert text not in bad_params.text, bad_params.text
