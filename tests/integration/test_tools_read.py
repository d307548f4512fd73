"""The read tools (sessions_list, sessions_history, agents_list) over the real api and Redis.

Calls go through `POST /tools/invoke` acting for a session, and through agent runs whose
echo model calls the tools, so both ways in answer the same.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock
from urllib.parse import quote

import httpx
import pytest

import switchboard.shared.store.sessions as session_store
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"
MAX_BYTES = 80 * 1024
Seed = Callable[..., str]


def configured(data: dict[str, Any]) -> pytest.MarkDecorator:
    """Run the test with this JSON config (indirect parametrization of `config_data`)."""
    return pytest.mark.parametrize("config_data", [data], indirect=True)


def visibility(level: str, **tools: Any) -> dict[str, Any]:
    """A config with `tools.sessions.visibility` and other `tools.*` settings."""
    return {"tools": {"sessions": {"visibility": level}, **tools}}


# A sub-agent acting over /tools/invoke is offered list/history only as an orchestrator.
ORCHESTRATORS = {"agents": {"defaults": {"subagents": {"maxSpawnDepth": 2}}}}


@pytest.fixture
def config_data(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The test's config: `{}` unless the test parametrizes it with `configured(...)`."""
    return dict(getattr(request, "param", {}))


@pytest.fixture
def seed(services: Services) -> Iterator[Seed]:
    """Create a session entry; each call is 1 s newer than the last unless `at_ms` is given.

    Returns the sessionId. ``messages`` are appended to its transcript at the same time.
    """
    clock = itertools.count(now_ms() - 30 * 60_000, 1000)

    def create(
        key: str,
        *,
        at_ms: int | None = None,
        messages: list[dict[str, Any]] | None = None,
        **fields: Any,
    ) -> str:
        at = at_ms if at_ms is not None else next(clock)
        with mock.patch.object(session_store, "now_ms", return_value=at):
            session_id, _ = services.store.sessions.ensure(key, on_create=fields)
        for message in messages or []:
            services.store.transcripts.append(key, {"timestamp": at, **message}, at)
        return session_id

    yield create


@pytest.fixture
def invoke(client: httpx.Client) -> Callable[..., dict[str, Any]]:
    """Call a tool over `POST /tools/invoke` for a session and return its result."""

    def call(tool: str, args: dict[str, Any] | None = None, session: str = "main") -> Any:
        body = {"tool": tool, "args": args or {}, "sessionKey": session}
        resp = client.post("/tools/invoke", json=body)
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert answer["ok"] is True
        return answer["result"]

    return call


def keys_of(result: dict[str, Any]) -> list[str]:
    """The row keys of a sessions_list result, in order."""
    assert result["count"] == len(result["sessions"])
    return [row["key"] for row in result["sessions"]]


def user(text: str) -> dict[str, Any]:
    """A user message in the transcript format."""
    return {"role": "user", "content": text}


def assistant(text: str, **extra: Any) -> dict[str, Any]:
    """An assistant message with one text block."""
    return {"role": "assistant", "content": [{"type": "text", "text": text}], **extra}


def tool_result(text: str) -> dict[str, Any]:
    """A tool result message."""
    return {
        "role": "toolResult",
        "toolCallId": "call_1",
        "toolName": "x",
        "isError": False,
        "content": [{"type": "text", "text": text}],
    }


def compact_size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


# --- visibility (SPEC §2) ------------------------------------------------------------------


@pytest.fixture
def family(seed: Seed, services: Services) -> dict[str, str]:
    """main → child → grandchild, main → a child in agent ops, plus unrelated sessions."""
    keys = {
        "unrelated": "agent:main:discord:group:dev",
        "ops_main": "agent:ops:main",
        "main": MAIN,
        "child": "agent:main:subagent:child",
        "grandchild": "agent:main:subagent:grandchild",
        "ops_child": "agent:ops:subagent:helper",
    }
    parents = {"child": MAIN, "grandchild": keys["child"], "ops_child": MAIN}
    for name, key in keys.items():
        parent = parents.get(name)
        seed(key, **({"spawnedBy": parent} if parent else {}))
        if parent:
            services.store.sessions.add_child(parent, key)
    return keys


@configured(visibility("self"))
def test_self_lists_and_reads_only_the_callers_session(
    invoke: Callable[..., Any], family: dict[str, str]
) -> None:
    """`self`: only the caller is listed (as `main`); even its child is forbidden, named."""
    listed = invoke("sessions_list")
    assert keys_of(listed) == ["main"]
    assert listed["scope"]["visibility"] == "self"
    assert "tools.sessions.visibility=self" in listed["scope"]["note"]
    for own in ("main", "current", MAIN):
        assert invoke("sessions_history", {"sessionKey": own})["sessionKey"] == "main"
    assert invoke("sessions_history", {"sessionKey": family["child"]}) == {
        "status": "forbidden",
        "error": "Session history visibility is restricted to the current session "
        "(tools.sessions.visibility=self).",
    }


@configured(visibility("tree"))
def test_tree_lists_the_caller_and_everything_it_spawned(
    invoke: Callable[..., Any], family: dict[str, str]
) -> None:
    """`tree`: caller + spawned closure, cross-agent child included, newest first."""
    listed = invoke("sessions_list")
    assert keys_of(listed) == [family["ops_child"], family["grandchild"], family["child"], "main"]
    assert listed["scope"] == {
        "visibility": "tree",
        "note": "Only this session and the sessions it spawned are listed "
        "(tools.sessions.visibility=tree).",
    }
    rows = {row["key"]: row for row in listed["sessions"]}
    assert rows[family["child"]]["spawnedBy"] == "main"
    assert rows[family["grandchild"]]["spawnedBy"] == family["child"]


@configured(visibility("tree"))
def test_tree_history_allows_listed_sessions_and_forbids_the_rest(
    invoke: Callable[..., Any], family: dict[str, str]
) -> None:
    """Every session `tree` lists is readable; others are forbidden with the right setting."""
    for key in keys_of(invoke("sessions_list")):
        assert "status" not in invoke("sessions_history", {"sessionKey": key}), key
    assert invoke("sessions_history", {"sessionKey": family["unrelated"]}) == {
        "status": "forbidden",
        "error": "Session history visibility is restricted to the current session tree "
        "(tools.sessions.visibility=tree).",
    }
    assert invoke("sessions_history", {"sessionKey": family["ops_main"]}) == {
        "status": "forbidden",
        "error": "Session history visibility is restricted. "
        "Set tools.sessions.visibility=all to allow cross-agent access.",
    }


@configured({**ORCHESTRATORS, **visibility("tree")})
def test_tree_of_a_child_does_not_reach_up_to_its_parent(
    invoke: Callable[..., Any], family: dict[str, str]
) -> None:
    """Acting for the child, `tree` shows the child and its grandchild only."""
    listed = invoke("sessions_list", session=family["child"])
    assert keys_of(listed) == [family["grandchild"], family["child"]]
    denied = invoke("sessions_history", {"sessionKey": "agent:main:main"}, session=family["child"])
    assert denied["status"] == "forbidden"


@configured(visibility("agent"))
def test_agent_lists_every_session_of_the_callers_agent_only(
    invoke: Callable[..., Any], family: dict[str, str]
) -> None:
    """`agent`: all of agent main's sessions, none of agent ops', cross-agent forbidden."""
    listed = invoke("sessions_list")
    expected = [family["grandchild"], family["child"], "main", family["unrelated"]]
    assert keys_of(listed) == expected
    assert "agent main" in listed["scope"]["note"]
    assert invoke("sessions_history", {"sessionKey": family["unrelated"]})["messages"] == []
    assert invoke("sessions_history", {"sessionKey": family["ops_child"]}) == {
        "status": "forbidden",
        "error": "Session history visibility is restricted. "
        "Set tools.sessions.visibility=all to allow cross-agent access.",
    }


@configured(visibility("all"))
def test_all_without_agent_to_agent_stays_within_the_agent(
    invoke: Callable[..., Any], family: dict[str, str]
) -> None:
    """`all` with agentToAgent off lists one agent; cross-agent reads name the switch."""
    listed = invoke("sessions_list")
    assert family["ops_main"] not in keys_of(listed)
    assert len(keys_of(listed)) == 4
    assert "tools.agentToAgent.enabled=true" in listed["scope"]["note"]
    assert invoke("sessions_history", {"sessionKey": family["ops_main"]}) == {
        "status": "forbidden",
        "error": "Agent-to-agent history is disabled. "
        "Set tools.agentToAgent.enabled=true to allow cross-agent access.",
    }


@configured(visibility("all", agentToAgent={"enabled": True, "allow": ["main", "ops"]}))
def test_all_with_an_allow_list_reaches_the_listed_agents_only(
    invoke: Callable[..., Any], family: dict[str, str], seed: Seed
) -> None:
    """`all` + agentToAgent.allow: ops is listed and readable, dev is neither."""
    seed("agent:dev:main")
    listed = invoke("sessions_list")
    assert set(keys_of(listed)) == {*family.values(), "main"} - {MAIN}
    assert "agent:dev:main" not in keys_of(listed)
    assert "status" not in invoke("sessions_history", {"sessionKey": family["ops_main"]})
    assert invoke("sessions_history", {"sessionKey": "agent:dev:main"}) == {
        "status": "forbidden",
        "error": "Agent-to-agent history denied by tools.agentToAgent.allow.",
    }


@configured(visibility("all", agentToAgent={"enabled": True}))
def test_all_with_an_open_allow_list_lists_every_agent(
    invoke: Callable[..., Any], family: dict[str, str], seed: Seed
) -> None:
    """An empty allow list means any agent: the global index, every agent's sessions."""
    seed("agent:dev:cron:nightly")
    listed = invoke("sessions_list")
    assert keys_of(listed)[0] == "agent:dev:cron:nightly"
    assert set(keys_of(listed)) == {*family.values(), "main", "agent:dev:cron:nightly"} - {MAIN}
    crons = invoke("sessions_list", {"kinds": ["cron"]})
    assert keys_of(crons) == ["agent:dev:cron:nightly"]


@configured(
    {
        "tools": {"sessions": {"visibility": "all"}, "agentToAgent": {"enabled": True}},
        "agents": {"defaults": {"sandbox": {"mode": "all"}}},
    }
)
def test_sandboxed_sessions_are_clamped_to_their_tree(
    invoke: Callable[..., Any], family: dict[str, str]
) -> None:
    """A sandboxed caller sees its tree only, whatever visibility says, and is told why."""
    listed = invoke("sessions_list")
    assert set(keys_of(listed)) == {
        "main",
        family["child"],
        family["grandchild"],
        family["ops_child"],
    }
    assert listed["scope"]["visibility"] == "tree"
    assert listed["scope"]["sandboxed"] is True
    assert "sessionToolsVisibility=spawned" in listed["scope"]["note"]
    denied = invoke("sessions_history", {"sessionKey": family["unrelated"]})
    assert denied["status"] == "forbidden"
    assert denied["error"].startswith(
        f"Session not visible from this sandboxed agent session: {family['unrelated']}"
    )
    assert "sessionToolsVisibility" in denied["error"]


@configured(
    {
        "tools": {"sessions": {"visibility": "all"}},
        "agents": {"defaults": {"sandbox": {"mode": "all", "sessionToolsVisibility": "all"}}},
    }
)
def test_a_sandbox_with_session_tools_visibility_all_keeps_the_configured_level(
    invoke: Callable[..., Any], family: dict[str, str]
) -> None:
    """`sessionToolsVisibility: "all"` lifts the clamp: the configured `all` applies."""
    listed = invoke("sessions_list")
    assert listed["scope"]["visibility"] == "all"
    assert family["unrelated"] in keys_of(listed)


# --- sessions_list parameters (SPEC §3) -------------------------------------------------------


@configured(visibility("agent"))
def test_kinds_filter_is_lower_cased_and_invalid_kinds_are_ignored(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """`kinds` keeps the valid kinds (any case); only invalid ones means no filter."""
    seed(MAIN)
    seed("agent:main:cron:nightly")
    seed("agent:main:hook:abc")
    seed("agent:main:telegram:group:42")
    assert keys_of(invoke("sessions_list", {"kinds": ["CRON", "bogus"]})) == [
        "agent:main:cron:nightly"
    ]
    both = invoke("sessions_list", {"kinds": ["group", " main "]})
    assert keys_of(both) == ["agent:main:telegram:group:42", "main"]
    assert len(keys_of(invoke("sessions_list", {"kinds": ["bogus"]}))) == 4
    assert keys_of(invoke("sessions_list", {"kinds": "hook"})) == ["agent:main:hook:abc"]


@configured(visibility("all", agentToAgent={"enabled": True, "allow": ["main", "dev*"]}))
def test_limit_counts_rows_after_visibility_and_kind_filtering(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """Newer invisible/other-kind sessions do not eat the limit (OpenClaw slices first)."""
    for i in range(3):
        seed(f"agent:main:discord:group:g{i}")
    for i in range(250):
        seed(f"agent:ops:cron:c{i}")  # newer, but ops is not in the allow list
    for i in range(30):
        seed(f"agent:main:cron:c{i}")  # newer, visible, but not groups
    listed = invoke("sessions_list", {"kinds": ["group"], "limit": 3})
    assert keys_of(listed) == [f"agent:main:discord:group:g{i}" for i in (2, 1, 0)]
    assert "partial" not in listed["scope"]
    top = invoke("sessions_list", {"limit": 2})
    assert keys_of(top) == ["agent:main:cron:c29", "agent:main:cron:c28"]


@configured(visibility("all", agentToAgent={"enabled": True, "allow": ["main", "dev*"]}))
def test_the_index_scan_is_bounded_and_says_when_it_stopped_early(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """Behind 5,000+ newer invisible sessions a listing stops and flags `scope.partial`."""
    seed("agent:main:cron:buried", at_ms=now_ms() - 3600_000)
    for i in range(5100):
        seed(f"agent:ops:cron:c{i}")
    listed = invoke("sessions_list")
    assert listed["count"] == 0
    assert listed["scope"]["partial"] is True


@configured(visibility("agent"))
def test_limit_defaults_to_50_and_is_clamped_to_1_and_200(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """Default 50; 0 → 1; 500 → 200; a string is ignored (default)."""
    for i in range(205):
        seed(f"agent:main:cron:job{i}")
    assert len(keys_of(invoke("sessions_list"))) == 50
    assert keys_of(invoke("sessions_list", {"limit": 0})) == ["agent:main:cron:job204"]
    assert len(keys_of(invoke("sessions_list", {"limit": 500}))) == 200
    assert len(keys_of(invoke("sessions_list", {"limit": 2.9}))) == 2
    assert len(keys_of(invoke("sessions_list", {"limit": "5"}))) == 50


@configured(visibility("agent"))
def test_active_minutes_keeps_recently_updated_sessions(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """`activeMinutes: N` drops sessions not updated within N minutes."""
    seed("agent:main:cron:old", at_ms=now_ms() - 3 * 3600_000)
    seed("agent:main:cron:recent", at_ms=now_ms() - 10 * 60_000)
    seed(MAIN, at_ms=now_ms())
    assert keys_of(invoke("sessions_list", {"activeMinutes": 60})) == [
        "main",
        "agent:main:cron:recent",
    ]
    assert keys_of(invoke("sessions_list", {"activeMinutes": 5})) == ["main"]
    assert len(keys_of(invoke("sessions_list"))) == 3


@configured(visibility("tree"))
def test_active_minutes_applies_to_tree_listings_too(
    invoke: Callable[..., Any], seed: Seed, services: Services
) -> None:
    """The activity filter works on the tree path (entries, not an index)."""
    seed(MAIN, at_ms=now_ms())
    seed("agent:main:subagent:stale", at_ms=now_ms() - 2 * 3600_000, spawnedBy=MAIN)
    services.store.sessions.add_child(MAIN, "agent:main:subagent:stale")
    assert keys_of(invoke("sessions_list", {"activeMinutes": 30})) == ["main"]
    assert len(keys_of(invoke("sessions_list"))) == 2


def test_message_limit_adds_the_last_messages_without_tool_results(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """`messageLimit` > 0 adds the last N non-tool messages, control tokens hidden."""
    seed(
        MAIN,
        messages=[
            user("first"),
            assistant("one"),
            user("run the tool"),
            {
                "role": "assistant",
                "content": [{"type": "toolCall", "id": "call_1", "name": "x", "arguments": {}}],
            },
            tool_result("tool output"),
            assistant("two"),
            assistant("NO_REPLY"),
        ],
    )
    listed = invoke("sessions_list", {"messageLimit": 2})
    messages = listed["sessions"][0]["messages"]
    assert [m["role"] for m in messages] == ["assistant", "assistant"]
    assert messages[0]["content"][0]["type"] == "toolCall"
    assert messages[1]["content"][0]["text"] == "two"
    assert "messages" not in invoke("sessions_list")["sessions"][0]
    assert "messages" not in invoke("sessions_list", {"messageLimit": -3})["sessions"][0]


def test_message_limit_is_capped_at_20_and_previews_are_redacted(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """`messageLimit: 50` gives 20 messages; credentials in previews are masked."""
    secret = "sk-" + "live" + "0123456789abcdefXYZ"
    seed(MAIN, messages=[user(f"m{i} key {secret}") for i in range(25)])
    messages = invoke("sessions_list", {"messageLimit": 50})["sessions"][0]["messages"]
    assert [m["content"].split()[0] for m in messages] == [f"m{i}" for i in range(5, 25)]
    assert all(secret not in m["content"] and "sk-[REDACTED]" in m["content"] for m in messages)


def test_row_carries_every_known_field_and_omits_unknown_ones(
    invoke: Callable[..., Any], seed: Seed, services: Services
) -> None:
    """The full SPEC §3 row shape, keys shown as the caller sees them."""
    child = "agent:main:subagent:worker"
    seed(MAIN)
    session_id = seed(
        child,
        spawnedBy=MAIN,
        label="worker",
        displayName="Worker bee",
        model="gpt-test",
        contextTokens=1200,
        totalTokens=3400,
        thinkingLevel="low",
        verboseLevel="on",
        systemSent=True,
        abortedLastRun=False,
        sendPolicy="deny",
        deliveryContext={"channel": "telegram", "to": "+4917", "accountId": "bot2"},
        lastChannel="whatsapp",
        status="error",
        inputTokens=7,
    )
    services.store.sessions.add_child(MAIN, child)
    row = invoke("sessions_list")["sessions"][0]
    entry = services.store.sessions.get(child)
    assert entry is not None
    assert row == {
        "key": child,
        "kind": "other",
        "channel": "telegram",
        "displayName": "Worker bee",
        "updatedAt": entry.updated_at_ms,
        "sessionId": session_id,
        "model": "gpt-test",
        "contextTokens": 1200,
        "totalTokens": 3400,
        "thinkingLevel": "low",
        "verboseLevel": "on",
        "systemSent": True,
        "abortedLastRun": False,
        "sendPolicy": "deny",
        "lastChannel": "telegram",
        "lastTo": "+4917",
        "deliveryContext": {"channel": "telegram", "to": "+4917", "accountId": "bot2"},
        "transcriptPath": f"/sessions/{quote(child, safe='')}/transcript.jsonl",
        "label": "worker",
        "spawnedBy": "main",
        "status": "failed",
    }
    bare = invoke("sessions_list")["sessions"][1]
    assert set(bare) == {"key", "kind", "channel", "updatedAt", "sessionId", "transcriptPath"}
    assert (bare["key"], bare["kind"], bare["channel"]) == ("main", "main", "unknown")


@configured(visibility("agent"))
def test_rows_derive_kind_channel_and_group_names_from_the_key(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """Kinds are judged after `agent:<id>:`; groups get `<channel>:g-<id>` names."""
    seed("agent:main:discord:group:dev")
    seed("agent:main:cron:nightly")
    seed("agent:main:node-7")
    seed(MAIN, lastChannel="signal")
    rows = {row["key"]: row for row in invoke("sessions_list")["sessions"]}
    group = rows["agent:main:discord:group:dev"]
    assert (group["kind"], group["channel"], group["displayName"]) == (
        "group",
        "discord",
        "discord:g-dev",
    )
    assert (
        rows["agent:main:cron:nightly"]["kind"],
        rows["agent:main:cron:nightly"]["channel"],
    ) == (
        "cron",
        "internal",
    )
    assert rows["agent:main:node-7"]["kind"] == "node"
    assert (rows["main"]["kind"], rows["main"]["channel"]) == ("main", "signal")


@configured(visibility("agent"))
def test_reserved_keys_are_never_listed(invoke: Callable[..., Any], seed: Seed) -> None:
    """`global` and `unknown` entries do not appear (scope per-sender)."""
    seed("unknown")
    seed("global")
    seed(MAIN)
    assert keys_of(invoke("sessions_list")) == ["main"]


@configured({"session": {"scope": "global"}, "tools": {"sessions": {"visibility": "agent"}}})
def test_global_main_session_is_listed_as_main(invoke: Callable[..., Any], seed: Seed) -> None:
    """Under `session.scope = global` the main session is `global` inside, `main` outside."""
    seed("global")
    seed("agent:main:cron:x")
    listed = invoke("sessions_list")
    assert keys_of(listed) == ["agent:main:cron:x", "main"]
    assert listed["sessions"][1]["kind"] == "main"
    assert invoke("sessions_history", {"sessionKey": "main"})["sessionKey"] == "main"


# --- sessions_history (SPEC §4) ---------------------------------------------------------------


def test_history_returns_the_last_messages_oldest_first_without_tools(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """`limit` keeps the newest N; tool results are dropped unless `includeTools`."""
    seed(
        MAIN,
        messages=[
            user("a"),
            assistant("b", usage={"input": 3}, cost={"total": 1}),
            tool_result("t"),
            user("c"),
        ],
    )
    result = invoke("sessions_history", {"sessionKey": "main"})
    assert [m["role"] for m in result["messages"]] == ["user", "assistant", "user"]
    assert "usage" not in result["messages"][1] and "cost" not in result["messages"][1]
    assert result["messages"][1]["__openclaw"] == {"seq": 2}
    assert result["sessionKey"] == "main"
    assert (result["truncated"], result["contentTruncated"], result["contentRedacted"]) == (
        False,
        False,
        False,
    )
    assert result["droppedMessages"] is False
    assert result["bytes"] == compact_size(result["messages"])
    with_tools = invoke("sessions_history", {"sessionKey": "main", "includeTools": True})
    assert [m["role"] for m in with_tools["messages"]] == [
        "user",
        "assistant",
        "toolResult",
        "user",
    ]
    last_two = invoke("sessions_history", {"sessionKey": "main", "limit": 2, "includeTools": True})
    assert [m["role"] for m in last_two["messages"]] == ["toolResult", "user"]


def test_history_limit_defaults_to_50_and_is_clamped_to_1000(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """Default 50 messages; `limit: 5000` is clamped, not an error; `limit: 0` gives one."""
    seed(MAIN, messages=[user(f"m{i}") for i in range(60)])
    assert len(invoke("sessions_history", {"sessionKey": "main"})["messages"]) == 50
    assert len(invoke("sessions_history", {"sessionKey": "main", "limit": 5000})["messages"]) == 60
    assert [
        m["content"]
        for m in invoke("sessions_history", {"sessionKey": "main", "limit": 0})["messages"]
    ] == ["m59"]


def test_history_hides_control_token_replies(invoke: Callable[..., Any], seed: Seed) -> None:
    """Assistant messages that are only NO_REPLY / ANNOUNCE_SKIP / REPLY_SKIP are hidden."""
    seed(
        MAIN,
        messages=[user("hi"), assistant(" no_reply "), assistant("ANNOUNCE_SKIP"), assistant("ok")],
    )
    texts = [m["content"] for m in invoke("sessions_history", {"sessionKey": "main"})["messages"]]
    assert texts == ["hi", [{"type": "text", "text": "ok"}]]


def test_history_redacts_credentials_and_says_so(invoke: Callable[..., Any], seed: Seed) -> None:
    """Secrets in texts and tool-call arguments are masked; `contentRedacted` is set."""
    token = "ghp_" + "Z" * 36
    seed(
        MAIN,
        messages=[
            user(f"my token is {token}"),
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"use {token}", "thinkingSignature": "sig"},
                    {
                        "type": "toolCall",
                        "id": "c1",
                        "name": "x",
                        "arguments": {"auth": f"Bearer {token}"},
                    },
                ],
            },
        ],
    )
    result = invoke("sessions_history", {"sessionKey": "main"})
    assert token not in json.dumps(result)
    assert result["messages"][0]["content"] == "my token is ghp_[REDACTED]"
    blocks = result["messages"][1]["content"]
    assert blocks[0] == {"type": "thinking", "thinking": "use ghp_[REDACTED]"}
    assert blocks[1]["arguments"] == {"auth": "Bearer [REDACTED]"}
    assert result["contentRedacted"] is True
    assert result["truncated"] is False


def test_history_cuts_long_texts_at_4000_characters(invoke: Callable[..., Any], seed: Seed) -> None:
    """A text over 4,000 characters is cut with the marker; the flags say so."""
    seed(MAIN, messages=[user("a" * 5000), assistant("b" * 4000), assistant("c" * 4001)])
    result = invoke("sessions_history", {"sessionKey": "main"})
    first, second, third = result["messages"]
    assert first["content"] == "a" * 4000 + "\n…(truncated)…"
    assert second["content"][0]["text"] == "b" * 4000
    assert third["content"][0]["text"] == "c" * 4000 + "\n…(truncated)…"
    assert (result["contentTruncated"], result["truncated"], result["droppedMessages"]) == (
        True,
        True,
        False,
    )


def test_history_stays_under_80_kib_by_dropping_the_oldest(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """Many large messages: the oldest are dropped until the answer fits 80 KiB."""
    seed(MAIN, messages=[user(f"m{i:02d} " + "x" * 3900) for i in range(30)])
    result = invoke("sessions_history", {"sessionKey": "main"})
    messages = result["messages"]
    assert 10 < len(messages) < 30
    assert messages[-1]["content"].startswith("m29 ")
    assert messages[0]["content"].startswith(f"m{30 - len(messages):02d} ")
    assert result["bytes"] == compact_size(messages) <= MAX_BYTES
    # Not more was dropped than needed: one more (same-sized) message would not fit.
    assert result["bytes"] + compact_size(messages[0]) + 1 > MAX_BYTES
    assert (result["droppedMessages"], result["truncated"], result["contentTruncated"]) == (
        True,
        True,
        False,
    )


def test_history_replaces_a_single_oversized_message_with_a_placeholder(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """One message over 80 KiB even after cutting becomes the omitted placeholder."""
    blocks = [{"type": "text", "text": "y" * 4000} for _ in range(25)]
    seed(MAIN, messages=[{"role": "assistant", "content": blocks}])
    result = invoke("sessions_history", {"sessionKey": "main"})
    assert result["messages"] == [
        {"role": "assistant", "content": "[sessions_history omitted: message too large]"}
    ]
    assert (result["droppedMessages"], result["truncated"]) == (True, True)
    assert result["bytes"] == compact_size(result["messages"])


@configured(ORCHESTRATORS)
def test_history_resolves_session_ids_current_and_main(
    invoke: Callable[..., Any], seed: Seed, services: Services
) -> None:
    """A sessionId resolves to its key, `current` to the caller; unknown ids are an error."""
    seed(MAIN, messages=[user("in main")])
    child = "agent:main:subagent:kid"
    child_id = seed(child, spawnedBy=MAIN, messages=[user("in kid")])
    services.store.sessions.add_child(MAIN, child)
    by_id = invoke("sessions_history", {"sessionKey": child_id.upper()})
    assert by_id["sessionKey"] == child
    assert by_id["messages"][0]["content"] == "in kid"
    current = invoke("sessions_history", {"session_key": "current"}, session=child)
    assert current["sessionKey"] == child
    assert invoke("sessions_history", {"sessionKey": "main"})["messages"][0]["content"] == "in main"
    missing = "0b1f6b6e-1d7c-4a43-9b7a-3f2d4c5e6a7b"
    assert invoke("sessions_history", {"sessionKey": missing}) == {
        "status": "error",
        "error": f"Session not found: {missing} (use the full sessionKey from sessions_list)",
    }


def test_history_of_an_unknown_but_visible_key_is_empty(
    invoke: Callable[..., Any], seed: Seed
) -> None:
    """A well-formed key with no session reads as zero messages, not an error."""
    seed(MAIN)
    result = invoke("sessions_history", {"sessionKey": "current"})
    assert result["messages"] == [] and result["bytes"] == 2


def test_history_needs_a_well_formed_session_key(client: httpx.Client) -> None:
    """Missing sessionKey and malformed keys are invalid input (HTTP 400), not results."""
    for args, message in [
        ({}, "sessionKey required"),
        ({"sessionKey": "   "}, "sessionKey required"),
        ({"sessionKey": "agent::x"}, "empty segment"),
    ]:
        resp = client.post("/tools/invoke", json={"tool": "sessions_history", "args": args})
        assert resp.status_code == 400, resp.text
        assert message in resp.json()["error"]["message"]


# --- agents_list (SPEC §8) --------------------------------------------------------------------

AGENTS = [
    {"id": "main", "name": "Main"},
    {"id": "ops", "name": " Ops team ", "subagents": {"allowAgents": ["*"]}},
    {"id": "dev"},
    {"id": "alpha", "subagents": {"allowAgents": []}},
]


@configured(
    {"agents": {"list": AGENTS, "defaults": {"subagents": {"allowAgents": ["Dev", "ghost"]}}}}
)
def test_agents_list_follows_the_sub_agent_allow_lists(invoke: Callable[..., Any]) -> None:
    """Requester first, allowed ids sorted; unconfigured ids flagged; `*` means every agent."""
    assert without_tools(invoke("agents_list")) == {
        "requester": "main",
        "allowAny": False,
        "agents": [
            {"id": "main", "name": "Main", "configured": True},
            {"id": "dev", "configured": True},
            {"id": "ghost", "configured": False},
        ],
    }
    assert without_tools(invoke("agents_list", session="agent:ops:main")) == {
        "requester": "ops",
        "allowAny": True,
        "agents": [
            {"id": "ops", "name": "Ops team", "configured": True},
            {"id": "alpha", "configured": True},
            {"id": "dev", "configured": True},
            {"id": "main", "name": "Main", "configured": True},
        ],
    }
    assert without_tools(invoke("agents_list", session="agent:alpha:main"))["agents"] == [
        {"id": "alpha", "configured": True}
    ]


def test_agents_list_without_agents_configured_is_just_the_requester(
    invoke: Callable[..., Any],
) -> None:
    """With no `agents.list`, the requester `main` alone, not configured."""
    assert without_tools(invoke("agents_list")) == {
        "requester": "main",
        "allowAny": False,
        "agents": [{"id": "main", "configured": False}],
    }


def without_tools(answer: dict[str, Any]) -> dict[str, Any]:
    """An `agents_list` answer without each row's `tools` (checked on their own)."""
    rows = answer["agents"]
    assert all("sessions_list" in row["tools"] for row in rows)
    return {**answer, "agents": [{k: v for k, v in r.items() if k != "tools"} for r in rows]}


# --- ways in (SPEC §10) -----------------------------------------------------------------------


def test_unknown_tool_is_404(client: httpx.Client) -> None:
    """`POST /tools/invoke` with a tool that does not exist answers 404."""
    resp = client.post("/tools/invoke", json={"tool": "sessions_nope", "args": {}})
    assert resp.status_code == 404
    assert resp.json()["ok"] is False


@configured(visibility("tree"))
def test_the_read_tools_are_offered_to_agent_runs(
    worker: Any, rpc: Callable[..., Any], seed: Seed, services: Services
) -> None:
    """An agent run's model calls the tools; results match what /tools/invoke gives."""
    seed("agent:ops:main")
    lines = [
        '/tool sessions_list {"limit": 5}',
        '/tool sessions_history {"sessionKey": "current"}',
        "/tool agents_list",
        '/tool sessions_history {"sessionKey": "agent:ops:main"}',
        "/tool sessions_history {}",
    ]
    started = rpc("agent", sessionKey="main", message="\n".join(lines))
    outcome = rpc("agent.wait", runId=started["runId"], timeoutMs=20_000)
    assert outcome["status"] == "ok", outcome
    listed, history, agents, cross, missing = (json.loads(r) for r in outcome["reply"].split("\n"))
    assert keys_of(listed) == ["main"]
    assert listed["scope"]["visibility"] == "tree"
    assert history["sessionKey"] == "main"
    assert history["messages"][-1]["content"] == "\n".join(lines)
    assert without_tools(agents) == {
        "requester": "main",
        "allowAny": False,
        "agents": [{"id": "main", "configured": False}],
    }
    assert cross == {
        "status": "forbidden",
        "error": "Session history visibility is restricted. "
        "Set tools.sessions.visibility=all to allow cross-agent access.",
    }
    assert missing == {
        "status": "error",
        "tool": "sessions_history",
        "error": "sessionKey required",
    }
