"""Bad input is refused with a clear error naming the field, and nothing in Redis changes.

Property tests (hypothesis) over the real api: malformed session keys, tool arguments of
the wrong type, numbers out of range, control characters and NUL in identifiers, invalid
UTF-8, deeply nested JSON and oversized bodies. Every refused request is checked against
a snapshot of the whole database (every key and its DUMP) taken just before it. Text
fields (messages, labels) are free text and may hold any character; identifiers may not.
Config values are checked the same way: the error names the dotted key path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchboard.shared.config import ConfigError, load_config, parse_config
from switchboard.shared.services import Services

pytestmark = pytest.mark.integration

HTTP_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MAX_BODY = 2 * 1024 * 1024
SAFE = "abcdefghijklmnopqrstuvwxyz0123456789_-.@#+=/"
# Characters no session key may hold (SPEC §1: illegal characters): whitespace and
# control characters, quotes, backslash, glob and hash-tag characters, non-ASCII.
BAD_KEY_CHARS = (
    [chr(c) for c in range(0x20)]
    + [" ", "\x7f", '"', "'", "\\", "*", "?", "[", "]", "{", "}", "%", "!", ","]
    + ["é", "ß", "\u00a0", "\u200b", "\u202e", "€", "😀", "\uff4d"]
)

Snapshot = dict[bytes, bytes | None]


def snapshot(r: redis.Redis) -> Snapshot:
    """Every key of the database with its serialized value (DUMP)."""
    return {key: r.dump(key) for key in r.scan_iter(count=1000)}  # type: ignore[misc]


@pytest.fixture
def refused(
    client: httpx.Client, redis_client: redis.Redis, services: Services
) -> Iterator[Callable[..., dict[str, Any]]]:
    """POST a body and assert it was refused (status, field named) with Redis unchanged."""
    services.store.sessions.ensure("agent:main:main")
    services.store.sessions.ensure("agent:main:telegram:group:g1", on_create={"label": "g1"})

    def post(
        path: str,
        body: Any,
        *,
        status: int = 400,
        names: str | None = None,
        raw: bytes | None = None,
        **kw: Any,
    ) -> dict[str, Any]:
        before = snapshot(redis_client)
        content = kw.pop("content", None)
        if content is None:
            content = raw if raw is not None else json.dumps(body).encode()
        resp = client.post(path, content=content, **kw)
        assert resp.status_code == status, (path, body if raw is None else raw[:80], resp.text)
        answer: dict[str, Any] = resp.json()
        assert answer["ok"] is False, answer
        error = answer["error"]
        assert set(error) >= {"type", "message"} and error["message"], error
        if names is not None:
            assert names.lower() in error["message"].lower(), (names, error["message"])
        assert snapshot(redis_client) == before, f"Redis changed on a refused request: {body}"
        return answer

    yield post


# --- session keys ----------------------------------------------------------------------

segment = st.text(alphabet=SAFE, min_size=1, max_size=20)
bad_char = st.sampled_from(BAD_KEY_CHARS)
bad_agent_id = st.one_of(
    st.text(alphabet="-_", min_size=1, max_size=3).map(lambda s: s + "x"),
    st.just("x" * 65),
    st.builds(lambda a, c, b: a + c + b, segment, bad_char, segment),
)
malformed_key = st.one_of(
    # an illegal character inside otherwise fine text (never at the ends: keys are trimmed)
    st.builds(lambda a, c, b: a + c + b, segment, bad_char, segment),
    st.builds(lambda a, c, b: f"agent:main:{a}{c}{b}", segment, bad_char, segment),
    # an empty segment, a missing rest, a bad agent id
    st.builds(lambda rest: f"agent::{rest}", segment),
    st.builds(lambda a: f"agent:{a}", st.sampled_from(["main", "ops", "x1"])),
    st.builds(lambda a, b: f"{a}::{b}", segment, segment),
    st.builds(lambda a: f"{a}:", segment),
    st.builds(lambda a, rest: f"agent:{a}:{rest}", bad_agent_id, segment),
    # too long
    st.integers(513, 2000).map(lambda n: "agent:main:" + "k" * n),
)


def key_requests(key: str) -> list[tuple[str, dict[str, Any]]]:
    """Every way to pass a session key, as (path, body)."""
    return [
        ("/rpc", {"method": "agent", "params": {"sessionKey": key, "message": "hi"}}),
        ("/rpc", {"method": "chat.send", "params": {"sessionKey": key, "message": "hi"}}),
        ("/rpc", {"method": "chat.history", "params": {"sessionKey": key}}),
        ("/rpc", {"method": "sessions.patch", "params": {"key": key, "label": "x"}}),
        ("/rpc", {"method": "sessions.delete", "params": {"key": key}}),
        ("/rpc", {"method": "sessions.resolve", "params": {"key": key}}),
        ("/tools/invoke", {"tool": "sessions_list", "args": {}, "sessionKey": key}),
        ("/tools/invoke", {"tool": "sessions_history", "args": {"sessionKey": key}}),
    ]


@HTTP_SETTINGS
@given(key=malformed_key)
def test_malformed_session_keys_are_refused(
    key: str, refused: Callable[..., dict[str, Any]], client: httpx.Client
) -> None:
    """A malformed key is a 400 naming the key, never a new session (SPEC §1)."""
    for path, body in key_requests(key):
        refused(path, body, names="key")


@HTTP_SETTINGS
@given(key=malformed_key)
def test_sessions_send_to_a_malformed_key_is_an_error_result(
    key: str, client: httpx.Client, redis_client: redis.Redis
) -> None:
    """`sessions_send` answers the contract's `{status: "error"}` naming the key; no writes."""
    before = snapshot(redis_client)
    body = {"tool": "sessions_send", "args": {"sessionKey": key, "message": "hi"}}
    resp = client.post("/tools/invoke", json=body)
    assert resp.status_code == 200, resp.text
    result = resp.json()["result"]
    assert result["status"] == "error" and "key" in result["error"].lower(), result
    assert snapshot(redis_client) == before


# --- tool arguments ----------------------------------------------------------------------

not_a_string = st.one_of(
    st.integers(), st.floats(allow_nan=False), st.booleans(), st.lists(st.integers(), max_size=3)
) | st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)
# (tool, the valid arguments, the string parameters it reads)
STRING_PARAMS = [
    ("sessions_history", {"sessionKey": "main"}, ["sessionKey"]),
    (
        "sessions_send",
        {"sessionKey": "agent:main:other", "message": "m"},
        ["message", "sessionKey"],
    ),
    ("sessions_send", {"label": "g1", "message": "m"}, ["label", "agentId"]),
    (
        "sessions_spawn",
        {"task": "t"},
        ["task", "label", "agentId", "model", "thinking", "cleanup", "mode", "runtime"],
    ),
]


@HTTP_SETTINGS
@given(
    case=st.sampled_from([(t, a, p) for t, a, ps in STRING_PARAMS for p in ps]),
    value=not_a_string,
)
def test_tool_arguments_of_the_wrong_type_are_refused(
    case: tuple[str, dict[str, Any], str], value: Any, refused: Callable[..., dict[str, Any]]
) -> None:
    """A string parameter given a number, boolean, list or object: 400 naming it."""
    tool, args, param = case
    refused("/tools/invoke", {"tool": tool, "args": {**args, param: value}}, names=param)


@HTTP_SETTINGS
@given(
    case=st.sampled_from(
        [("sessions_list", "kinds", "kinds"), ("sessions_spawn", "tasks", "tasks")]
    ),
    value=st.one_of(st.integers(), st.booleans(), st.dictionaries(st.text(max_size=3), st.none())),
)
def test_list_arguments_of_the_wrong_type_are_refused(
    case: tuple[str, str, str], value: Any, refused: Callable[..., dict[str, Any]]
) -> None:
    """`kinds` and `tasks` given a scalar or an object: 400 naming them."""
    tool, param, name = case
    refused("/tools/invoke", {"tool": tool, "args": {param: value}}, names=name)


@HTTP_SETTINGS
@given(name=st.builds(lambda a, c, b: a + c + b, segment, bad_char, segment))
def test_unknown_or_garbled_tool_names_are_not_found(
    name: str, refused: Callable[..., dict[str, Any]]
) -> None:
    """A tool name with control characters, NUL or look-alikes is a 404 naming the tool."""
    refused("/tools/invoke", {"tool": name, "args": {}}, status=404, names="tool")


# --- numbers out of range ----------------------------------------------------------------

# (method, field, lowest valid, highest valid, other required params)
RANGES = [
    ("chat.history", "limit", 1, 1000, {}),
    ("sessions.list", "limit", 1, 1_000_000, {}),
    ("sessions.list", "activeMinutes", 1, 1_000_000, {}),
    ("deliveries.list", "limit", 1, 200, {}),
    ("agent.wait", "timeoutMs", 0, 600_000, {"runId": "r"}),
    ("agent", "timeout", 0, 3600, {"message": "m"}),
]


def out_of_range(lo: int, hi: int) -> st.SearchStrategy[Any]:
    """Values that are not an integer within lo..hi."""
    return st.one_of(
        st.integers(max_value=lo - 1),
        st.integers(min_value=hi + 1),
        st.integers(min_value=10**19, max_value=10**40),
        st.booleans(),
        st.text(alphabet="0123456789", min_size=1, max_size=4),
        st.none().map(lambda _: [lo]),
    )


@HTTP_SETTINGS
@given(data=st.data(), case=st.sampled_from(RANGES))
def test_numbers_out_of_range_are_refused(
    data: st.DataObject,
    case: tuple[str, str, int, int, dict[str, Any]],
    refused: Callable[..., dict[str, Any]],
) -> None:
    """Gateway params outside their range (or not numbers): 400 naming the field."""
    method, field, lo, hi, required = case
    value = data.draw(out_of_range(lo, hi))
    body = {"method": method, "params": {**required, field: value}}
    refused("/rpc", body, names=field)


@pytest.mark.parametrize(
    "number,names",
    [
        (b"1e400", "limit"),
        (b"-1e400", "limit"),
        (b"1.5e308", "limit"),
        (b"1" * 40, "limit"),
        (b"1" * 5000, "not valid JSON"),  # the parser's own limit
    ],
)
def test_huge_numbers_in_the_body_are_refused(
    number: bytes, names: str, refused: Callable[..., dict[str, Any]]
) -> None:
    """Numbers beyond any range (or float infinity) are refused, never crash the parser."""
    body = b'{"method": "chat.history", "params": {"limit": ' + number + b"}}"
    refused("/rpc", None, raw=body, names=names)


# --- bytes that are not JSON -------------------------------------------------------------


@HTTP_SETTINGS
@given(
    prefix=st.text(alphabet=SAFE, max_size=10),
    junk=st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80"]),
    path=st.sampled_from(["/rpc", "/tools/invoke"]),
)
def test_invalid_utf8_is_refused(
    prefix: str, junk: bytes, path: str, refused: Callable[..., dict[str, Any]]
) -> None:
    """Invalid UTF-8 anywhere in the body: 400 "not valid JSON"."""
    body = b'{"method": "chat.send", "tool": "sessions_list", "params": {"message": "'
    body += prefix.encode() + junk + b'"}}'
    refused(path, None, raw=body, names="JSON")


@pytest.mark.parametrize("path", ["/rpc", "/tools/invoke"])
@pytest.mark.parametrize("opener,closer", [(b"[", b"]"), (b'{"a":', b"}")])
def test_deeply_nested_json_is_refused(
    path: str, opener: bytes, closer: bytes, refused: Callable[..., dict[str, Any]]
) -> None:
    """100,000 levels of nesting: a 400 saying the depth limit, never a RecursionError 500."""
    depth = 100_000
    nested = opener * depth + b"1" + closer * depth
    body = b'{"method": "sessions.list", "tool": "sessions_list", "params": ' + nested + b"}"
    refused(path, None, raw=body, names="deeper than 64 levels")


@pytest.mark.parametrize("path", ["/rpc", "/tools/invoke"])
@pytest.mark.parametrize("chunked", [False, True])
def test_oversized_bodies_get_413(
    path: str, chunked: bool, refused: Callable[..., dict[str, Any]]
) -> None:
    """Over 2 MB, announced by Content-Length or streamed in chunks: 413."""
    message = "x" * (MAX_BODY + 1)
    data = json.dumps({"method": "agent", "tool": "sessions_send", "params": {"message": message}})
    if not chunked:
        refused(path, None, raw=data.encode(), status=413, names="2 MB")
        return
    encoded = data.encode()
    pieces = (encoded[i : i + 65536] for i in range(0, len(encoded), 65536))
    refused(path, None, status=413, names="2 MB", content=pieces)


@pytest.mark.parametrize(
    "raw",
    [b"", b"null", b"[]", b'"text"', b"1", b"{", b'{"method": null}', b'{"tool": 5}'],
)
@pytest.mark.parametrize("path", ["/rpc", "/tools/invoke"])
def test_bodies_that_are_not_requests_are_refused(
    raw: bytes, path: str, refused: Callable[..., dict[str, Any]]
) -> None:
    """Empty, scalar, array or mistyped bodies: 400."""
    refused(path, None, raw=raw)


# --- config ------------------------------------------------------------------------------

# (dotted path as errors show it, where to put it, invalid values)
CONFIG_FIELDS: list[tuple[str, Callable[[Any], dict[str, Any]], st.SearchStrategy[Any]]] = [
    (
        "session.agentToAgent.maxPingPongTurns",
        lambda v: {"session": {"agentToAgent": {"maxPingPongTurns": v}}},
        st.integers().filter(lambda n: not 0 <= n <= 5) | st.text(max_size=3) | st.booleans(),
    ),
    (
        "runs.timeoutSeconds",
        lambda v: {"runs": {"timeoutSeconds": v}},
        st.integers().filter(lambda n: not 1 <= n <= 3600) | st.floats(allow_nan=False),
    ),
    (
        "delivery.maxAttempts",
        lambda v: {"delivery": {"maxAttempts": v}},
        st.integers().filter(lambda n: not 1 <= n <= 100) | st.lists(st.integers(), max_size=2),
    ),
    (
        "agents.defaults.subagents.maxChildrenPerAgent",
        lambda v: {"agents": {"defaults": {"subagents": {"maxChildrenPerAgent": v}}}},
        st.integers().filter(lambda n: not 1 <= n <= 10_000) | st.none(),
    ),
    (
        "agents.list[0].id",
        lambda v: {"agents": {"list": [{"id": v}]}},
        st.builds(lambda a, c, b: a + c + b, segment, bad_char, segment) | st.integers(),
    ),
    (
        "tools.agentToAgent.enabled",
        lambda v: {"tools": {"agentToAgent": {"enabled": v}}},
        st.integers() | st.text(max_size=4) | st.lists(st.booleans(), max_size=2),
    ),
    (
        "tools.agentToAgent.allow",
        lambda v: {"tools": {"agentToAgent": {"allow": v}}},
        st.integers() | st.booleans() | st.dictionaries(st.text(max_size=3), st.text(max_size=3)),
    ),
    (
        "session.scope",
        lambda v: {"session": {"scope": v}},
        st.text(max_size=12).filter(lambda s: s not in ("per-sender", "global")) | st.integers(),
    ),
    (
        "channels.relay.webhook.url",
        lambda v: {"channels": {"relay": {"webhook": {"url": v}}}},
        st.text(max_size=20).filter(lambda s: not s.startswith(("http://", "https://"))),
    ),
]


@settings(max_examples=600, deadline=None)
@given(data=st.data(), field=st.sampled_from(CONFIG_FIELDS))
def test_invalid_config_values_name_their_key(
    data: st.DataObject,
    field: tuple[str, Callable[[Any], dict[str, Any]], st.SearchStrategy[Any]],
) -> None:
    """An invalid value anywhere in the config: ConfigError naming its dotted key path."""
    path, place, values = field
    value = data.draw(values)
    with pytest.raises(ConfigError) as info:
        parse_config(place(value))
    assert path in str(info.value), (path, value, str(info.value))
    assert info.value.key_path == path


@pytest.mark.parametrize(
    "content,says",
    [
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"session": {"mainKey": "\xff"}}', "not readable"),
        (b'{"session": ', "invalid JSON5"),
        (b"[1, 2]", "top level must be an object"),
    ],
)
def test_config_files_that_cannot_be_read_are_clear_errors(
    content: bytes, says: str, tmp_path: Path
) -> None:
    """Deep nesting, invalid UTF-8, truncated JSON5, a non-object: ConfigError, no traceback."""
    file = tmp_path / "switchboard.json5"
    file.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(file)
    assert says in str(info.value)
