"""History read incrementally (`store.windows`, `runtime.history_cache`), on a real Redis and
a real worker: a claim reads only the messages after the window its process holds, and a
run is sent exactly the messages the plain path (the last 200, read and converted whole)
makes at that moment, across a window that slides past 200 messages and across a session
deleted and created again."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from switchboard.shared.runtime import executor
from switchboard.shared.runtime.executor import HISTORY_LIMIT, _history
from switchboard.shared.runtime.transcript import to_model_messages
from switchboard.shared.services import Services
from switchboard.shared.store import Store, TranscriptWindows
from switchboard.shared.store.runs import Claim, NewRun
from switchboard.shared.store.windows import ENTRY_OVERHEAD

pytestmark = pytest.mark.integration

TARGET = "agent:main:hc-target"


@pytest.fixture
def config_data() -> dict[str, Any]:
    """Sends with no reply-back rounds: each is the target's run and its announce run."""
    return {
        "session": {"agentToAgent": {"maxPingPongTurns": 0}},
        "tools": {"sessions": {"visibility": "agent"}},
    }


# -- the claim step against Redis ---------------------------------------------------------


def _store(redis_url: str) -> Store:
    return Store.from_url(redis_url)


def _fill(store: Store, key: str, count: int, text: str) -> None:
    """Append ``count`` alternating user/assistant messages to ``key``'s transcript."""
    for i in range(count):
        if i % 2 == 0:
            msg: dict[str, Any] = {"role": "user", "content": f"{text}{i}", "timestamp": i}
        else:
            msg = {"role": "assistant", "content": [{"type": "text", "text": f"{text}{i}"}]}
        store.transcripts.append(key, msg, 1)


def _claim(store: Store, key: str, run_id: str, limit: int) -> Claim:
    """Record a run, take the lane, claim it, end it (freeing the lane): the claim."""
    msg = {"role": "user", "content": f"run {run_id}", "timestamp": 2}
    store.runs.submit(NewRun(run_id=run_id, session_key=key, message=msg, timeout_s=30))
    claim = store.runs.claim(run_id, key, history=limit)
    assert isinstance(claim, Claim), claim
    store.runs.finish(run_id, key, claim.attempt, status="ok", reply="r")
    return claim


def _plain(store: Store, key: str, limit: int) -> list[str]:
    return [str(m["content"]) for m in store.transcripts.tail(key, limit)]


def _texts(claim: Claim) -> list[str]:
    return [str(m["content"]) for m in claim.history or []]


def test_a_claim_reads_only_what_is_newer_than_the_window(redis_url: str) -> None:
    store, key = _store(redis_url), "agent:main:hc-claims"
    windows = store.runs.windows
    assert isinstance(windows, TranscriptWindows)
    store.sessions.ensure(key)
    _fill(store, key, 12, "a")
    first = _claim(store, key, "hc-r1", 10)  # its message is seq 13: it reads 4..13
    assert (windows.hits, windows.misses) == (0, 1)
    assert first.entries is not None and [e.seq for e in first.entries] == list(range(4, 14))
    _fill(store, key, 3, "b")  # 14..16
    second = _claim(store, key, "hc-r2", 10)  # 17: reads 14..17 only, keeps 8..13
    assert (windows.hits, windows.misses) == (1, 1)
    assert second.entries is not None and [e.seq for e in second.entries] == list(range(8, 18))
    assert _texts(second) == _plain(store, key, 10)
    assert second.entries[0] is first.entries[4]  # kept, not read again
    assert all(e.weight > ENTRY_OVERHEAD for e in second.entries)  # weighed as stored


def test_an_end_extends_the_window_so_the_next_claim_reads_no_transcript(
    redis_url: str,
) -> None:
    """The messages a run's end wrote join the process's window: the next run's claim
    answers them and its own new message without reading the transcript, and its history
    is the plain path's."""
    store, key = _store(redis_url), "agent:main:hc-extend"
    store.sessions.ensure(key)
    _fill(store, key, 4, "a")
    msg = {"role": "user", "content": "run e1", "timestamp": 2}
    store.runs.submit(NewRun(run_id="hc-e1", session_key=key, message=msg, timeout_s=30))
    claim = store.runs.claim("hc-e1", key, history=10)
    assert isinstance(claim, Claim)
    said = {"role": "assistant", "content": [{"type": "text", "text": "said"}]}
    store.runs.finish("hc-e1", key, claim.attempt, status="ok", reply="said", messages=[said])
    assert store.runs.windows.base(key, 10).seq == 6  # type: ignore[union-attr]
    before = store.stats.command_calls()
    second = _claim(store, key, "hc-e2", 10)
    assert "xrevrange" not in store.stats.command_calls().since(before)
    assert _texts(second) == _plain(store, key, 10)
    assert second.entries is not None and [e.seq for e in second.entries] == list(range(1, 8))


def test_a_session_deleted_and_created_again_is_read_whole(redis_url: str) -> None:
    """The window of the old session names its sessionId: the new session (further on than
    the old one got) is read whole, never joined to the old window."""
    store, key = _store(redis_url), "agent:main:hc-reset"
    store.sessions.ensure(key)
    _fill(store, key, 6, "old")
    _claim(store, key, "hc-o1", 50)
    old_seq = store.runs.windows.base(key, 50).seq  # type: ignore[union-attr]
    assert store.sessions.delete(key)
    store.sessions.ensure(key)
    _fill(store, key, old_seq + 4, "new")
    claim = _claim(store, key, "hc-n1", 50)
    assert store.runs.windows.misses == 2  # type: ignore[union-attr]
    assert not any(t.startswith("old") for t in _texts(claim))
    assert _texts(claim)[-1] == "run hc-n1"
    assert len(_texts(claim)) == old_seq + 5


# -- runs through the worker --------------------------------------------------------------

Seen = list[tuple[list[ModelMessage], list[ModelMessage]]]


def _without_instructions(messages: list[ModelMessage]) -> list[ModelMessage]:
    return [replace(m, instructions=None) if isinstance(m, ModelRequest) else m for m in messages]


def _recording_model(services: Services, seen: Seen) -> Callable[..., FunctionModel]:
    """A model that records what each request was sent beside what the plain path makes
    from the target's transcript at that moment (the last 200 messages, read and
    converted whole), and answers: ANNOUNCE_SKIP to an announce step, else `pong`."""

    def answer(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        tail = services.store.transcripts.tail(TARGET, HISTORY_LIMIT)
        seen.append((_without_instructions(messages), to_model_messages(_history(tail))))
        last = messages[-1]
        prompt = str(last.parts[-1].content) if isinstance(last, ModelRequest) else ""
        skip = prompt.startswith("Agent-to-agent announce step:")
        return ModelResponse(parts=[TextPart("ANNOUNCE_SKIP" if skip else "pong")])

    return lambda *_a, **_k: FunctionModel(answer, model_name="recorder")


def _send(client: httpx.Client, services: Services, text: str, seen: Seen) -> None:
    """Send ``text`` to the target and wait for both its runs (the reply, the announce)."""
    expect = len(seen) + 2
    body = {
        "tool": "sessions_send",
        "args": {"sessionKey": TARGET, "message": text, "timeoutSeconds": 20},
    }
    resp = client.post("/tools/invoke", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["result"]["reply"] == "pong", resp.text
    deadline = time.monotonic() + 20
    while len(seen) < expect or services.store.redis.exists(services.store.ks.lane(TARGET)):
        assert time.monotonic() < deadline, "the announce run did not end"
        time.sleep(0.02)


def _seed(services: Services, count: int, text: str) -> None:
    services.store.sessions.ensure(TARGET)
    for i in range(count):
        if i % 3 == 2:
            msg: dict[str, Any] = {
                "role": "toolResult",
                "toolCallId": f"c{i}",
                "toolName": "sessions_list",
                "content": [{"type": "text", "text": f"{text} result {i}"}],
                "timestamp": 1_700_000_000_000 + i,
            }
        elif i % 3 == 1:
            msg = {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"{text} answer {i}"},
                    {
                        "type": "toolCall",
                        "id": f"c{i + 1}",
                        "name": "sessions_list",
                        "arguments": {},
                    },
                ],
                "timestamp": 1_700_000_000_000 + i,
                "stopReason": "toolUse",
            }
        else:
            msg = {"role": "user", "content": f"{text} ask {i}", "timestamp": 1_700_000_000_000 + i}
        services.store.transcripts.append(TARGET, msg, 1)


def test_runs_in_a_long_session_are_sent_what_the_plain_path_makes(
    worker: Any,
    client: httpx.Client,
    services: Services,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session past 200 messages, then sends (each a run and its announce run): every
    request is sent exactly the plain path's messages; with the windows on, the claims
    after the first read only what was newer."""
    seen: Seen = []
    monkeypatch.setattr(executor, "resolve_model", _recording_model(services, seen))
    _seed(services, 230, "early")
    for i in range(4):
        _send(client, services, f"message {i}", seen)
    assert len(seen) == 8
    for sent, plain in seen:
        assert sent == plain
    assert len(seen[-1][0]) > 100  # a real window, sliding past the first messages
    windows = services.store.runs.windows
    assert windows is not None and windows.hits >= 6


def test_no_run_is_sent_a_deleted_sessions_history(
    worker: Any,
    client: httpx.Client,
    services: Services,
    rpc: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session deleted (`sessions.delete`) and built again past where it had got: its
    next run is sent the new transcript only, as the plain path makes it."""
    seen: Seen = []
    monkeypatch.setattr(executor, "resolve_model", _recording_model(services, seen))
    _seed(services, 40, "stale")
    _send(client, services, "first", seen)
    _send(client, services, "second", seen)  # the windows on: read after the window
    rpc("sessions.delete", key=TARGET)
    _seed(services, 80, "fresh")
    seen.clear()
    _send(client, services, "after the delete", seen)
    assert seen and all(sent == plain for sent, plain in seen)
    texts = " ".join(str(m) for sent, _ in seen for m in sent)
    assert "fresh ask" in texts and "stale" not in texts
