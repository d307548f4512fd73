"""Unit tests for a process's history windows (`store.windows`) and the model forms kept
on their entries (`runtime.history_cache`). The claim script's side (what Redis answers
after a window, and when it refuses one) is in tests/integration/test_history_cache.py."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.shared.runtime import history_cache
from switchboard.shared.runtime.history_cache import model_history
from switchboard.shared.runtime.transcript import to_model_messages
from switchboard.shared.store.windows import ENTRY_OVERHEAD, HistoryEntry, TranscriptWindows

pytestmark = pytest.mark.unit

SID, OTHER_SID = "sid-1", "sid-2"


def _msg(seq: int, text: str | None = None) -> dict[str, Any]:
    role = "user" if seq % 2 else "assistant"
    text = text or f"m{seq}"
    content: Any = text if role == "user" else [{"type": "text", "text": text}]
    return {"role": role, "content": content, "timestamp": 1_700_000_000_000 + seq}


def _rows(first: int, last: int, text: str = "") -> list[HistoryEntry]:
    return [
        HistoryEntry(s, _msg(s, f"{text}m{s}" if text else None)) for s in range(first, last + 1)
    ]


def _seqs(entries: Any) -> list[int]:
    return [e.seq for e in entries]


def test_a_session_not_held_is_a_miss_and_its_full_read_becomes_the_window() -> None:
    w = TranscriptWindows()
    assert w.base("s", 5) is None
    got = w.merge("s", SID, _rows(1, 5), base=None, after=None, limit=5)
    assert _seqs(got) == [1, 2, 3, 4, 5]
    base = w.base("s", 5)
    assert base is not None and (base.session_id, base.seq) == (SID, 5)
    assert (w.hits, w.misses, w.weight) == (0, 1, 5 * ENTRY_OVERHEAD)


def test_a_hit_adds_only_the_newer_messages_and_keeps_the_last_limit() -> None:
    w = TranscriptWindows()
    w.merge("s", SID, _rows(1, 5), base=None, after=None, limit=5)
    base = w.base("s", 5)
    got = w.merge("s", SID, _rows(6, 7), base=base, after=5, limit=5)
    assert _seqs(got) == [3, 4, 5, 6, 7]
    assert got[0] is base.entries[2]  # the held entries themselves (their model forms too)
    nothing_new = w.merge("s", SID, [], base=w.base("s", 5), after=7, limit=5)
    assert _seqs(nothing_new) == [3, 4, 5, 6, 7]
    assert (w.hits, w.misses) == (2, 1)


def test_newer_messages_that_fill_the_window_replace_it() -> None:
    w = TranscriptWindows()
    w.merge("s", SID, _rows(1, 5), base=None, after=None, limit=5)
    got = w.merge("s", SID, _rows(20, 24), base=w.base("s", 5), after=5, limit=5)
    assert _seqs(got) == [20, 21, 22, 23, 24]  # not 1..5 + 20..24: 6..19 were never read


def test_an_answer_after_another_window_is_refused() -> None:
    w = TranscriptWindows()
    w.merge("s", SID, _rows(1, 5), base=None, after=None, limit=5)
    base = w.base("s", 5)
    with pytest.raises(ValueError):
        w.merge("s", SID, _rows(7, 7), base=base, after=6, limit=5)
    with pytest.raises(ValueError):
        w.merge("s", OTHER_SID, _rows(6, 6), base=base, after=5, limit=5)
    with pytest.raises(ValueError):
        w.merge("s", SID, _rows(6, 6), base=None, after=5, limit=5)


def test_a_reset_session_replaces_its_window_even_with_a_lower_seq() -> None:
    """A session deleted and created again (a new sessionId) starts its counter again: its
    full read replaces the old window however far that one had got."""
    w = TranscriptWindows()
    w.merge("s", SID, _rows(1, 9, "old"), base=None, after=None, limit=5)
    got = w.merge("s", OTHER_SID, _rows(1, 3, "new"), base=None, after=None, limit=5)
    assert [e.message["content"] for e in got] == [
        "newm1",
        [{"type": "text", "text": "newm2"}],
        "newm3",
    ]
    base = w.base("s", 5)
    assert base is not None and (base.session_id, base.seq) == (OTHER_SID, 3)
    assert w.weight == 3 * ENTRY_OVERHEAD


def test_an_older_read_of_the_same_transcript_does_not_replace_a_newer_window() -> None:
    w = TranscriptWindows()
    first = w.merge("s", SID, _rows(1, 5), base=None, after=None, limit=5)
    w.merge("s", SID, _rows(6, 8), base=w.base("s", 5), after=5, limit=5)
    stale = w.merge("s", SID, list(first), base=None, after=None, limit=5)
    assert _seqs(stale) == [1, 2, 3, 4, 5]  # what that claim read, for that claim
    assert w.base("s", 5).seq == 8  # type: ignore[union-attr]


def test_a_window_serves_a_larger_limit_only_when_it_holds_everything() -> None:
    w = TranscriptWindows()
    w.merge("full", SID, _rows(1, 5), base=None, after=None, limit=5)  # maybe more before 1
    w.merge("short", SID, _rows(1, 3), base=None, after=None, limit=5)  # the whole transcript
    assert w.base("full", 3) is not None
    assert w.base("full", 10) is None
    assert w.base("short", 10) is not None


def test_sessions_are_bounded_least_recently_used_first() -> None:
    w = TranscriptWindows(max_sessions=2)
    w.merge("a", SID, _rows(1, 2), base=None, after=None, limit=5)
    w.merge("b", SID, _rows(1, 2), base=None, after=None, limit=5)
    assert w.base("a", 5) is not None  # a used again: b is now the oldest
    w.merge("c", SID, _rows(1, 2), base=None, after=None, limit=5)
    assert len(w) == 2 and w.base("b", 5) is None
    assert w.base("a", 5) is not None and w.base("c", 5) is not None


def test_weight_is_bounded_over_all_sessions() -> None:
    """An entry weighs its stored JSON plus the overhead; the oldest sessions go first."""
    w = TranscriptWindows(max_bytes=10 * ENTRY_OVERHEAD + 100)
    w.merge("a", SID, _rows(1, 4), base=None, after=None, limit=5)
    w.merge("b", SID, _rows(1, 4), base=None, after=None, limit=5)
    w.merge("c", SID, _rows(1, 4), base=None, after=None, limit=5)
    assert w.weight == 8 * ENTRY_OVERHEAD and w.base("a", 5) is None
    w.merge("c", SID, _rows(5, 9), base=w.base("c", 5), after=4, limit=5)  # c grows to 5
    assert w.weight == 9 * ENTRY_OVERHEAD
    big = [HistoryEntry(1, _msg(1), stored_bytes=2 * ENTRY_OVERHEAD)]
    w.merge("d", SID, big, base=None, after=None, limit=5)  # 3 units: b (4) must go
    assert w.base("b", 5) is None and w.base("c", 5) is not None
    assert w.weight == 8 * ENTRY_OVERHEAD
    w.drop("c")
    assert w.base("c", 5) is None and w.weight == 3 * ENTRY_OVERHEAD


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        TranscriptWindows(max_bytes=0)


def _mixed_transcript() -> list[dict[str, Any]]:
    """An orphaned tool result first, then user, tool call, result, note, compaction marker."""
    t = 1_700_000_000_000
    return [
        {"role": "toolResult", "toolCallId": "c0", "toolName": "x", "content": [], "timestamp": t},
        {"role": "user", "content": "hi", "timestamp": t + 1},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm"},
                {
                    "type": "toolCall",
                    "id": "c1",
                    "name": "sessions_list",
                    "arguments": {"limit": 2},
                },
            ],
            "timestamp": t + 2,
            "usage": {"input": 3, "output": 4},
            "stopReason": "toolUse",
        },
        {
            "role": "toolResult",
            "toolCallId": "c1",
            "toolName": "sessions_list",
            "content": [{"type": "text", "text": "[]"}],
            "isError": False,
            "timestamp": t + 3,
        },
        {"role": "system", "content": [{"type": "text", "text": "note"}], "timestamp": t + 4},
        {"role": "system", "__openclaw": {"kind": "compaction"}, "timestamp": t + 5},
        {
            "role": "user",
            "content": "again",
            "timestamp": t + 6,
            "provenance": {"kind": "inter_session", "sourceSessionKey": "agent:main:main"},
        },
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}], "timestamp": t + 7},
        {"role": "user", "content": "last", "timestamp": t + 8},
    ]


def test_model_history_is_what_the_whole_conversion_makes() -> None:
    msgs = _mixed_transcript()
    entries = [HistoryEntry(i + 1, m) for i, m in enumerate(msgs)]
    assert model_history(entries) == to_model_messages(msgs[1:])  # from the first user message
    no_user = [HistoryEntry(1, msgs[0])]
    assert model_history(no_user) == to_model_messages(msgs[:1])


def test_model_forms_are_made_once_per_message(monkeypatch: pytest.MonkeyPatch) -> None:
    msgs = _mixed_transcript()
    entries = [HistoryEntry(i + 1, m) for i, m in enumerate(msgs)]
    first = model_history(entries)
    made: list[dict[str, Any]] = []
    real = history_cache.model_unit
    monkeypatch.setattr(history_cache, "model_unit", lambda m: made.append(m) or real(m))
    more = [*entries, HistoryEntry(len(msgs) + 1, _msg(11, "newest"))]
    second = model_history(more)
    assert made == [more[-1].message]  # only the new message was converted
    assert second[: len(first) - 1] == first[:-1]
    assert second == to_model_messages([*msgs[1:], more[-1].message])


def test_a_request_a_response_follows_is_folded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    msgs = _mixed_transcript()
    entries = [HistoryEntry(i + 1, m) for i, m in enumerate(msgs)]
    first = model_history(entries)
    folded: list[int] = []
    real = history_cache.fold_request
    monkeypatch.setattr(
        history_cache, "fold_request", lambda units: folded.append(len(units)) or real(units)
    )
    more = [*entries, HistoryEntry(len(msgs) + 1, _msg(20, "reply")), *_rows(21, 21)]
    second = model_history(more)
    # Only the request that was open (now a response follows it) and the newest one: the
    # requests before were folded by the first call.
    assert folded == [1, 1]
    assert all(a is b for a, b in zip(first[:-1], second, strict=False))
    assert second[len(first) - 1] == first[-1]  # the request that was open, folded the same
    assert second == to_model_messages([*msgs[1:], *(e.message for e in more[len(msgs) :])])


def test_a_window_that_starts_inside_a_run_of_requests_folds_it_from_its_start() -> None:
    msgs = [
        {"role": "user", "content": "one", "timestamp": 1},
        {"role": "user", "content": "two", "timestamp": 2},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}], "timestamp": 3},
        {"role": "user", "content": "three", "timestamp": 4},
    ]
    whole = [HistoryEntry(i + 1, m) for i, m in enumerate(msgs)]
    assert model_history(whole) == to_model_messages(msgs)
    cut = whole[1:]  # the same entries (their memos), from the second message
    assert model_history(cut) == to_model_messages(msgs[1:])
    assert model_history(whole) == to_model_messages(msgs)  # and back: each start its own
