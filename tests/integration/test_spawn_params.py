"""`sessions_spawn`'s newer OpenClaw parameters, end to end (real api, worker and Redis):
`context: "fork"`, `expectsCompletionMessage: false`, `completionTarget: "parent"`,
`attachments`, `taskName`, `runTimeoutSeconds` (`timeoutSeconds` refused) and the refused
channel-delivery keys, over /tools/invoke and through the model loop (the echo model's
`/tool` directive)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from switchboard.shared.flows.spawn import FORK_MESSAGE_LIMIT
from switchboard.shared.services import Services
from switchboard.shared.store.runs import now_ms

pytestmark = pytest.mark.integration

MAIN = "agent:main:main"


# -- helpers ------------------------------------------------------------------------------


def invoke(client: httpx.Client, args: dict[str, Any], session: str = "main") -> httpx.Response:
    """POST sessions_spawn to /tools/invoke."""
    body = {"tool": "sessions_spawn", "args": args, "sessionKey": session}
    return client.post("/tools/invoke", json=body)


def spawn(client: httpx.Client, **args: Any) -> dict[str, Any]:
    """Call sessions_spawn over /tools/invoke and return the tool result."""
    resp = invoke(client, args)
    assert resp.status_code == 200, resp.text
    result: dict[str, Any] = resp.json()["result"]
    return result


def wait_until(check: Callable[[], Any], timeout_s: float = 20, what: str = "condition") -> Any:
    """Poll until `check()` is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def spawn_record(services: Services, run_id: str) -> dict[str, Any]:
    """The spawn hash of a child run."""
    run = services.store.runs.get(run_id)
    assert run is not None
    found = services.store.spawns.get(str(run.meta["spawnId"]))
    assert found is not None
    return dict(found.fields)


def wait_done(services: Services, run_id: str) -> dict[str, Any]:
    """Wait until the child's spawn finished its announce and cleanup."""
    return wait_until(
        lambda: (r := spawn_record(services, run_id)).get("status") == "done" and r,
        what="the spawn to finish",
    )


def announces(services: Services, key: str = MAIN) -> list[dict[str, Any]]:
    """The sub-agent announces in a session's transcript."""
    return [
        m
        for m in services.store.transcripts.all(key)
        if (m.get("provenance") or {}).get("sourceTool") == "subagent_announce"
    ]


def plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages without the store's per-entry sequence marker."""
    return [{k: v for k, v in m.items() if k != "__openclaw"} for m in messages]


def agent_turn(rpc: Callable[..., Any], message: str, timeout_ms: int = 15_000) -> dict[str, Any]:
    """Run one turn of the main session and wait for its outcome."""
    started = rpc("agent", sessionKey="main", message=message)
    outcome: dict[str, Any] = rpc("agent.wait", runId=started["runId"], timeoutMs=timeout_ms)
    assert outcome["status"] == "ok", outcome
    return outcome


def tool_results(services: Services, key: str) -> list[str]:
    """The text of every toolResult in a session's transcript."""
    return [
        str(m["content"][0]["text"])
        for m in services.store.transcripts.all(key)
        if m["role"] == "toolResult"
    ]


def raw_transcripts(services: Services) -> dict[str, list[str]]:
    """Every stored transcript entry, undecoded, by transcript key."""
    redis = services.store.redis
    out: dict[str, list[str]] = {}
    for key in redis.scan_iter(match=services.store.ks.transcript("*"), count=1000):
        rows = redis.xrange(key)
        out[str(key)] = [
            (fields.get(b"m") or fields.get("m") or b"").decode()
            if isinstance(fields.get(b"m") or fields.get("m"), bytes)
            else str(fields.get("m"))
            for _, fields in rows
        ]
    return out


def subagent_sessions(services: Services) -> list[str]:
    """Every sub-agent session key in the store."""
    return [
        k
        for k, _ in services.store.sessions.recent_keys(
            agent_ids=None, kinds=None, min_updated_ms=None, limit=100
        )
        if ":subagent:" in k
    ]


# -- context: fork ----------------------------------------------------------------------------


def test_fork_copies_the_requester_history_bounded(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """The child's transcript starts with the requester's last FORK_MESSAGE_LIMIT messages,
    in order, then its task; an isolated child starts with its task."""
    agent_turn(rpc, "hello from the parent")
    for index in range(FORK_MESSAGE_LIMIT + 5):
        note = {"role": "user", "content": f"parent note {index}", "timestamp": now_ms()}
        services.store.transcripts.append(MAIN, note, now_ms())
    parent = plain(services.store.transcripts.all(MAIN))
    assert len(parent) > FORK_MESSAGE_LIMIT

    forked = spawn(client, task="go\n/reply forked-ok", context="fork")
    isolated = spawn(client, task="go\n/reply isolated-ok")
    assert forked["status"] == "accepted" and forked["context"] == "fork"
    assert isolated["context"] == "isolated"
    wait_done(services, forked["runId"])
    wait_done(services, isolated["runId"])

    child = services.store.transcripts.all(forked["childSessionKey"])
    assert plain(child[:FORK_MESSAGE_LIMIT]) == parent[-FORK_MESSAGE_LIMIT:]
    task, answer = child[FORK_MESSAGE_LIMIT], child[FORK_MESSAGE_LIMIT + 1]
    assert task["provenance"]["sourceTool"] == "sessions_spawn"
    assert "[Subagent Task]: go" in task["content"]
    assert answer["role"] == "assistant" and answer["content"][0]["text"] == "forked-ok"
    assert len(child) == FORK_MESSAGE_LIMIT + 2
    seqs = [m["__openclaw"]["seq"] for m in child]
    assert seqs == list(range(1, len(child) + 1))  # the child's own sequence numbers

    alone = services.store.transcripts.all(isolated["childSessionKey"])
    assert [m["role"] for m in alone] == ["user", "assistant"]
    assert alone[0]["provenance"]["sourceTool"] == "sessions_spawn"
    assert spawn_record(services, forked["runId"])["context"] == "fork"


def test_fork_through_the_model_loop_gives_the_child_the_parent_turns(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """A model calling sessions_spawn with context fork: the child's model is sent the
    parent's earlier turns (its input counts their words) and its transcript holds them."""
    agent_turn(rpc, "remember the password swordfish\n/reply noted")
    calls = [
        {"task": "what was the password\n/reply asked", "context": "fork", "label": "f"},
        {"task": "what was the password\n/reply asked", "label": "i"},
    ]
    message = "\n".join("/tool sessions_spawn " + json.dumps(c) for c in calls)
    outcome = agent_turn(rpc, message)
    forked, isolated = (json.loads(line) for line in outcome["reply"].splitlines())
    for result in (forked, isolated):
        assert result["status"] == "accepted"
        wait_done(services, result["runId"])
    child = services.store.transcripts.all(forked["childSessionKey"])
    texts = [m["content"] if isinstance(m["content"], str) else "" for m in child]
    assert "remember the password swordfish\n/reply noted" in texts
    assert child[-1]["role"] == "assistant"
    runs = [services.store.runs.get(r["runId"]) for r in (forked, isolated)]
    assert all(r is not None for r in runs)
    forked_in, isolated_in = (int(r.usage["input"]) for r in runs if r is not None)
    assert forked_in > isolated_in + 4  # the forked turns were sent to the model
    assert "swordfish" not in json.dumps(
        services.store.transcripts.all(isolated["childSessionKey"])
    )


# -- expectsCompletionMessage: false ------------------------------------------------------------


def test_fire_and_forget_runs_records_and_never_announces(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """No announce in the parent's transcript and no delivery, over HTTP and from a model
    call; the child still runs and its outcome is recorded."""
    over_http = spawn(client, task="go\n/reply quiet-http", expectsCompletionMessage=False)
    assert over_http["status"] == "accepted"
    assert over_http["expectsCompletionMessage"] is False
    args = {"task": "go\n/reply quiet-loop", "expectsCompletionMessage": False}
    outcome = agent_turn(rpc, "/tool sessions_spawn " + json.dumps(args))
    from_loop = json.loads(outcome["reply"])
    assert from_loop["status"] == "accepted" and from_loop["expectsCompletionMessage"] is False
    for result, text in ((over_http, "quiet-http"), (from_loop, "quiet-loop")):
        record = wait_done(services, result["runId"])
        assert record["outcome"] == "ok" and record["result"] == text
        assert record["announce"] == "skipped"
        assert record.get("deliveryId") is None
    time.sleep(0.5)
    assert announces(services) == []
    assert services.store.deliveries.for_session(MAIN, 50) == []
    assert services.store.spawns.active_children(MAIN) == []
    # The same spawn without the flag does announce (the check above can fail).
    loud = spawn(client, task="go\n/reply loud")
    wait_done(services, loud["runId"])
    assert len(announces(services)) == 1


def test_batch_entries_inherit_the_new_parameters(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """A batch's top-level context and expectsCompletionMessage apply to every entry
    (an entry's own taskName and attachments stay its own); join all refuses
    completionTarget."""
    agent_turn(rpc, "batch parent says hi")
    result = spawn(
        client,
        tasks=[
            {"task": "go\n/reply one", "taskName": "one"},
            {"task": "Read it.", "attachments": [{"name": "t.txt", "content": "/reply two"}]},
        ],
        context="fork",
        expectsCompletionMessage=False,
    )
    assert result["status"] == "accepted"
    records = [wait_done(services, run["runId"]) for run in result["runs"]]
    assert [r["result"] for r in records] == ["one", "two"]
    assert [r.get("taskName") for r in records] == ["one", None]
    assert all(r["announce"] == "skipped" and r["context"] == "fork" for r in records)
    for run in result["runs"]:
        first = services.store.transcripts.all(run["childSessionKey"])[0]
        assert first["content"] == "batch parent says hi"
    assert announces(services) == []
    resp = invoke(client, {"tasks": ["a", "b"], "join": "all", "completionTarget": "parent"})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == (
        'completionTarget="parent" is not supported with join="all"'
    )


# -- completionTarget: parent ---------------------------------------------------------------------


def test_completion_target_parent_is_a_private_turn_of_the_requester(
    worker: Any, client: httpx.Client, rpc: Callable[..., Any], services: Services
) -> None:
    """The result starts a run of the requester (its message is the announce, once) and is
    delivered to no channel; a default spawn's announce is delivered."""
    result = spawn(client, task="go\n/reply for-the-parent", completionTarget="parent")
    assert result["status"] == "accepted" and result["completionTarget"] == "parent"
    record = wait_done(services, result["runId"])
    assert record["announce"] == "delivered" and record.get("deliveryId") is None
    turn_id = str(record["announceRunId"])
    turn = wait_until(
        lambda: (r := services.store.runs.get(turn_id)) is not None and r.terminal and r,
        what="the requester's private turn",
    )
    assert turn.status == "ok" and turn.session_key == MAIN
    assert turn.meta == {"spawnId": record["spawnId"], "completionTarget": "parent"}
    [announce] = announces(services)
    assert "Result: for-the-parent" in announce["content"]
    messages = services.store.transcripts.all(MAIN)
    at = next(i for i, m in enumerate(messages) if m is announce or m == announce)
    assert messages[at + 1]["role"] == "assistant"  # the requester's model answered it
    assert services.store.deliveries.for_session(MAIN, 50) == []

    # Through the model loop as well.
    args = {"task": "go\n/reply loop-parent", "completionTarget": "parent"}
    accepted = json.loads(agent_turn(rpc, "/tool sessions_spawn " + json.dumps(args))["reply"])
    looped = wait_done(services, accepted["runId"])
    wait_until(
        lambda: (r := services.store.runs.get(str(looped["announceRunId"]))) and r.terminal,
        what="the second private turn",
    )
    assert len(announces(services)) == 2
    assert services.store.deliveries.for_session(MAIN, 50) == []

    default = spawn(client, task="go\n/reply delivered")
    wait_done(services, default["runId"])
    assert len(services.store.deliveries.for_session(MAIN, 50)) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"completionTarget": "child"},
            'sessions_spawn completionTarget must be "parent" or omitted.',
        ),
        (
            {"completionTarget": "parent", "expectsCompletionMessage": False},
            'sessions_spawn completionTarget="parent" cannot be combined with '
            "expectsCompletionMessage=false.",
        ),
    ],
)
def test_completion_target_errors(
    worker: Any, client: httpx.Client, services: Services, args: dict[str, Any], message: str
) -> None:
    """Thrown as in OpenClaw: HTTP 400 with the message, nothing created."""
    resp = invoke(client, {"task": "x", **args})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == message
    assert subagent_sessions(services) == []


# -- attachments ---------------------------------------------------------------------------------


def _assert_in_no_transcript(
    services: Services, needles: list[str], *, but_user_input: bool = False
) -> None:
    for key, entries in raw_transcripts(services).items():
        for entry in entries:
            provenance = json.loads(entry).get("provenance") or {}
            if but_user_input and provenance.get("kind") == "external_user":
                continue  # the user's own message that carried the call
            for needle in needles:
                assert needle not in entry, f"{needle!r} stored in {key}: {entry[:200]}"


def test_attachments_reach_the_child_model_and_no_transcript(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """The child's model sees both attachments (its reply comes from a directive inside
    one); no transcript holds their content; the run record drops them at its end."""
    binary = base64.b64encode(b"BIN-PAYLOAD-55 \xff\xfe").decode()
    result = spawn(
        client,
        task="Read the attached files.",
        attachments=[
            {"name": "brief.txt", "content": "/reply saw-brief-7f3\nSECRET-PAYLOAD-91"},
            {
                "name": "data.bin",
                "content": binary,
                "encoding": "base64",
                "mimeType": "application/octet-stream",
            },
        ],
    )
    assert result["status"] == "accepted"
    receipt = result["attachments"]
    assert receipt["count"] == 2
    assert [f["name"] for f in receipt["files"]] == ["brief.txt", "data.bin"]
    assert receipt["totalBytes"] == len("/reply saw-brief-7f3\nSECRET-PAYLOAD-91") + 17
    record = wait_done(services, result["runId"])
    assert record["result"] == "saw-brief-7f3"  # the child's model read brief.txt
    assert record["attachments"] == "2"
    run_key = services.store.ks.run(result["runId"])
    assert services.store.redis.hget(run_key, "attachments") is None
    run = services.store.runs.get(result["runId"])
    assert run is not None and run.attachments == []
    _assert_in_no_transcript(services, ["SECRET-PAYLOAD-91", "/reply saw-brief-7f3", binary])
    assert "SECRET" not in json.dumps(record)


def test_attachments_from_a_model_call_are_redacted_from_the_parent_transcript(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """Through the model loop: the child's model sees the (base64) attachment; the parent's
    stored tool call carries OpenClaw's redaction marker instead of the content."""
    content = base64.b64encode(b"/reply loop-saw-attachment\nLOOP-SECRET-33").decode()
    args = {
        "task": "Read it.",
        "attachments": [{"name": "a.md", "content": content, "encoding": "base64"}],
    }
    call = "/tool sessions_spawn " + json.dumps(args)
    accepted = json.loads(agent_turn(rpc, call)["reply"])
    record = wait_done(services, accepted["runId"])
    assert record["result"] == "loop-saw-attachment"
    [assistant] = [m for m in services.store.transcripts.all(MAIN) if m["role"] == "assistant"][:1]
    [block] = [b for b in assistant["content"] if b["type"] == "toolCall"]
    assert block["arguments"]["attachments"] == [
        {"name": "a.md", "content": "__OPENCLAW_REDACTED__", "encoding": "base64"}
    ]
    _assert_in_no_transcript(services, ["LOOP-SECRET-33", content], but_user_input=True)


def test_a_cancelled_childs_attachments_are_deleted(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A child cancelled mid-run (`subagents cancel`) loses its attachments with its run."""
    result = spawn(
        client,
        task="go\n/sleep 10\n/reply never",
        attachments=[{"name": "a.txt", "content": "CANCELLED-SECRET"}],
    )
    run_key = services.store.ks.run(result["runId"])
    assert services.store.redis.hget(run_key, "attachments") is not None
    body = {"tool": "subagents", "args": {"action": "cancel", "runId": result["runId"]}}
    resp = client.post("/tools/invoke", json={**body, "sessionKey": "main"})
    assert resp.status_code == 200, resp.text
    wait_until(
        lambda: (r := services.store.runs.get(result["runId"])) is not None and r.terminal,
        what="the cancelled run to end",
    )
    assert services.store.redis.hget(run_key, "attachments") is None
    _assert_in_no_transcript(services, ["CANCELLED-SECRET"])


@pytest.mark.parametrize(
    ("attachments", "error"),
    [
        (
            [{"name": f"f{i}.txt", "content": "x"} for i in range(51)],
            "attachments_file_count_exceeded (maxFiles=50)",
        ),
        (
            [{"name": "a.bin", "content": "not base64!", "encoding": "base64"}],
            "attachments_invalid_base64_or_too_large (attachmentIndex=0)",
        ),
        (
            [{"name": "a.txt", "content": "x", "encoding": "hex"}],
            "attachments_invalid_member (encoding must be utf8 or base64)",
        ),
        (
            [{"name": "a.txt", "content": "x"}, {"name": "A.TXT", "content": "y"}],
            "attachments_duplicate_name (attachmentIndex=1 name=A.TXT)",
        ),
        (
            [{"name": "../a.txt", "content": "x"}],
            "attachments_invalid_name (attachmentIndex=0 forbidden character)",
        ),
        (
            [{"name": "big.txt", "content": "x" * (1024 * 1024 + 1)}],
            "attachments_file_bytes_exceeded (attachmentIndex=0 name=big.txt bytes=1048577 "
            "maxFileBytes=1048576)",
        ),
    ],
)
def test_attachment_errors(
    worker: Any,
    client: httpx.Client,
    services: Services,
    attachments: list[dict[str, Any]],
    error: str,
) -> None:
    """OpenClaw's attachment error codes as `status: error`; nothing is created."""
    assert spawn(client, task="x", attachments=attachments) == {"status": "error", "error": error}
    assert subagent_sessions(services) == []


# -- taskName, timeouts, refused keys ------------------------------------------------------------


def test_task_name_is_kept_on_the_spawn_and_the_child(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """A valid taskName comes back in the result and is stored on the spawn and the child."""
    result = spawn(client, task="go\n/reply named", taskName="fetch_data-2")
    assert result["taskName"] == "fetch_data-2"
    record = wait_done(services, result["runId"])
    assert record["taskName"] == "fetch_data-2"
    entry = services.store.sessions.get(result["childSessionKey"])
    assert entry is not None and entry.get("taskName") == "fetch_data-2"


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("Fetch", 'Invalid taskName "Fetch". Use 1-64 chars matching [a-z][a-z0-9_-]*.'),
        ("9lives", 'Invalid taskName "9lives". Use 1-64 chars matching [a-z][a-z0-9_-]*.'),
        ("a" * 65, f'Invalid taskName "{"a" * 65}". Use 1-64 chars matching [a-z][a-z0-9_-]*.'),
        (
            "last",
            'Invalid taskName "last". Reserved subagent targets cannot be used as taskName values.',
        ),
        (
            "all",
            'Invalid taskName "all". Reserved subagent targets cannot be used as taskName values.',
        ),
    ],
)
def test_invalid_task_names(
    worker: Any, client: httpx.Client, services: Services, name: str, error: str
) -> None:
    """OpenClaw's taskName errors as `status: error`, with nothing created."""
    assert spawn(client, task="x", taskName=name) == {"status": "error", "error": error}
    assert subagent_sessions(services) == []


TIMEOUT_REFUSED = (
    'sessions_spawn does not support "timeoutSeconds". Use "runTimeoutSeconds" for a '
    "per-run timeout."
)


def test_run_timeout_seconds_and_the_refused_older_name(
    worker: Any, client: httpx.Client, services: Services
) -> None:
    """An integer >= 0 (a numeric string too); anything else is OpenClaw's error; the older
    `timeoutSeconds` is refused with OpenClaw 2026.9.6's text (in a batch entry too)."""
    for bad in ("soon", -1, 1.5, True):
        resp = invoke(client, {"task": "x", "runTimeoutSeconds": bad})
        assert resp.status_code == 400, bad
        assert resp.json()["error"]["message"] == "runTimeoutSeconds must be a non-negative integer"
    for args in (
        {"task": "x", "timeoutSeconds": 1},
        {"tasks": [{"task": "x", "timeoutSeconds": 1}]},
    ):
        resp = invoke(client, args)
        assert resp.status_code == 400
        assert resp.json()["error"]["message"] == TIMEOUT_REFUSED
    assert subagent_sessions(services) == []
    old = spawn(client, task="go\n/sleep 4\n/reply late", runTimeoutSeconds=1)
    as_text = spawn(client, task="go\n/reply fine", runTimeoutSeconds="30")
    assert wait_done(services, old["runId"])["outcome"] == "timeout"
    assert wait_done(services, as_text["runId"])["runTimeoutSeconds"] == 30


CHANNEL_KEYS = ["target", "transport", "channel", "to", "threadId", "thread_id", "replyTo"]


@pytest.mark.parametrize("key", CHANNEL_KEYS)
def test_channel_delivery_keys_are_refused(
    worker: Any, client: httpx.Client, services: Services, key: str
) -> None:
    """Each channel-delivery key is refused with OpenClaw's message, before anything."""
    resp = invoke(client, {"task": "x", key: "somewhere"})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == (
        f'sessions_spawn does not support "{key}"; remove channel-delivery parameters.'
    )
    assert subagent_sessions(services) == []


def test_timeout_seconds_refused_through_the_model_loop(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """A model passing `timeoutSeconds` gets `status: error` with OpenClaw 2026.9.6's text."""
    agent_turn(rpc, "/tool sessions_spawn " + json.dumps({"task": "x", "timeoutSeconds": 5}))
    [text] = tool_results(services, MAIN)
    assert json.loads(text) == {
        "status": "error",
        "tool": "sessions_spawn",
        "error": TIMEOUT_REFUSED,
    }
    assert subagent_sessions(services) == []


def test_refused_key_through_the_model_loop(
    worker: Any, rpc: Callable[..., Any], services: Services
) -> None:
    """A model passing `to` gets `status: error` with the message as its tool result."""
    args = {"task": "x", "to": "room-9"}
    agent_turn(rpc, "/tool sessions_spawn " + json.dumps(args) + "\n/reply done")
    [text] = tool_results(services, MAIN)
    result = json.loads(text)
    assert result["status"] == "error"
    assert result["error"] == (
        'sessions_spawn does not support "to"; remove channel-delivery parameters.'
    )
    assert subagent_sessions(services) == []
