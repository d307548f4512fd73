"""The pure parts of the sub-agent flow: announce wording, stats formatting, child prompts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import pytest

from switchboard.shared.flows.subagent import (
    announce_text,
    format_duration,
    format_tokens,
    is_silent,
    status_label,
    task_label,
)
from switchboard.shared.flows.subagent_prompts import (
    ChildBrief,
    child_system_prompt,
    child_task_message,
)
from switchboard.shared.store.spawns import SpawnRecord as Record

pytestmark = pytest.mark.unit

CHILD = "agent:main:subagent:0b6c1c55-3a47-4c2e-9a40-8c1f1d7f3e11"


def spawn(**fields: Any) -> Record:
    """A frozen spawn record with sensible defaults."""
    base = {"childKey": CHILD, "requesterKey": "agent:main:main", "task": "do it"}
    return Record(id="s1", fields={**base, **fields})


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "n/a"), (0, "n/a"), (-5, "n/a"), (1499, "1s"), (59_400, "59s"), (61_000, "1m1s"),
     (3_600_000, "1h0m"), (7_380_000, "2h3m")],
)  # fmt: skip
def test_format_duration(ms: int | None, text: str) -> None:
    """Runtimes render as n/a, s, m+s or h+m, from rounded seconds."""
    assert format_duration(ms) == text


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0"), (-3, "0"), (12, "12"), (999, "999"), (1000, "1.0k"), (197_000, "197.0k"),
     (2_500_000, "2.5m")],
)  # fmt: skip
def test_format_tokens(count: int, text: str) -> None:
    """Token counts render as OpenClaw's stats line does (k and m suffixes)."""
    assert format_tokens(count) == text


def test_task_label_prefers_the_label_then_the_task_on_one_line() -> None:
    """The label wins; else the task with whitespace collapsed and cut at 80 chars."""
    assert task_label(spawn(label="research")) == "research"
    assert task_label(spawn(task="line one\n  line two")) == "line one line two"
    assert task_label(spawn(task="x" * 100)) == "x" * 77 + "..."
    assert task_label(spawn(task="")) == "task"


def test_status_labels_follow_the_runtime_outcome() -> None:
    """ok, timeout and error map to OpenClaw's wording; errors carry their message."""
    assert status_label(spawn(outcome="ok")) == "completed successfully"
    assert status_label(spawn(outcome="timeout")) == "timed out"
    assert status_label(spawn(outcome="error", error="boom")) == "failed: boom"
    assert status_label(spawn(outcome="error")) == "failed: unknown error"


def test_only_the_childs_own_reply_can_silence_it() -> None:
    """ANNOUNCE_SKIP silences only as the run's reply, never as a tool result."""
    assert is_silent(spawn(result="ANNOUNCE_SKIP", resultSource="reply"))
    assert not is_silent(spawn(result="ANNOUNCE_SKIP", resultSource="toolResult"))
    assert not is_silent(spawn(result="ANNOUNCE_SKIP please", resultSource="reply"))


def test_announce_text_is_normalized_with_a_stats_line(tmp_path: Path) -> None:
    """Headline, Status/Result/Notes, then runtime, tokens, keys and transcript path."""
    svc: Any = SimpleNamespace(settings=SimpleNamespace(data_dir=tmp_path))
    record = spawn(
        label="job",
        outcome="timeout",
        error="run timed out after 1s",
        result="",
        usage={"input": 12, "output": 1000},
        startedAt=1_000,
        endedAt=4_000,
        sessionId="sid-1",
    )
    assert announce_text(svc, record).splitlines() == [
        'A subagent task "job" just timed out.',
        "",
        "Status: timeout",
        "Result: (no output)",
        "Notes: run timed out after 1s",
        "",
        f"Stats: runtime 3s • tokens 1.0k (in 12 / out 1.0k) • sessionKey {CHILD} • "
        f"sessionId sid-1 • transcript /sessions/{quote(CHILD, safe='')}/transcript.jsonl",
    ]


def test_child_task_message_matches_openclaw() -> None:
    """The child's first message: the context line(s), then `[Subagent Task]: <task>`."""
    brief = ChildBrief(
        task="summarise", child_key=CHILD, requester_key="agent:main:main",
        requester_channel="telegram", depth=1, max_depth=1,
    )  # fmt: skip
    assert child_task_message(brief) == (
        "[Subagent Context] You are running as a subagent (depth 1/1). Results auto-announce "
        "to your requester; do not busy-poll for status.\n\n[Subagent Task]: summarise"
    )


def test_child_system_prompt_names_the_sessions_and_spawning_rights() -> None:
    """Session context lists label, requester, channel and own key; orchestrators may spawn."""
    leaf = ChildBrief("a  b", CHILD, "agent:main:main", "telegram", 1, 1, label="L")
    text = child_system_prompt(leaf)
    assert text.startswith("# Subagent Context")
    assert "- You were created to handle: a b" in text
    assert text.endswith(
        "## Session Context\n- Label: L\n- Requester session: agent:main:main.\n"
        f"- Requester channel: telegram.\n- Your session: {CHILD}."
    )
    assert "Sub-Agent Spawning" not in text
    orchestrator = ChildBrief("t", CHILD, "agent:main:main", None, 1, 2)
    assert "You CAN spawn your own sub-agents" in child_system_prompt(orchestrator)
