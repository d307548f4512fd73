"""The agent-to-agent rules: skip tokens, who speaks, the next move, the exact prompts."""

from __future__ import annotations

import pytest

from switchboard.shared.flows import a2a_rules as rules
from switchboard.shared.flows.a2a_rules import Move, next_move

pytestmark = pytest.mark.unit


def _move(turn: int, reply: str | None, *, status: str = "ok", skip: str | None = None) -> Move:
    return next_move(turn=turn, max_turns=3, skip_reason=skip, status=status, reply=reply)


@pytest.mark.parametrize(
    ("text", "visible"),
    [
        ("hello", "hello"),
        ("  hello \n", "hello"),
        ("", None),
        ("   ", None),
        (None, None),
        ("REPLY_SKIP", None),
        (" ANNOUNCE_SKIP\n", None),
        ("NO_REPLY", None),
        ("reply_skip", "reply_skip"),
        ("REPLY_SKIP please", "REPLY_SKIP please"),
    ],
)
def test_visible_reply_drops_empty_and_token_only_text(
    text: str | None, visible: str | None
) -> None:
    """Only a non-empty reply that is not exactly a control token is passed on."""
    assert rules.visible_reply(text) == visible


def test_requester_speaks_odd_turns() -> None:
    """Turn 1 is the requester reacting to the target's reply; turns alternate from there."""
    assert [rules.speaker_of(t) for t in (1, 2, 3, 4, 5)] == [
        "requester",
        "target",
        "requester",
        "target",
        "requester",
    ]


@pytest.mark.parametrize(
    ("requester", "target", "max_turns", "reason"),
    [
        ("agent:main:main", "agent:main:hook:x", 5, None),
        ("agent:main:main", "agent:main:main", 5, "self_send"),
        (None, "agent:main:hook:x", 5, "no_requester"),
        ("agent:main:main", "agent:main:hook:x", 0, "disabled"),
    ],
)
def test_ping_pong_skip_reasons(
    requester: str | None, target: str, max_turns: int, reason: str | None
) -> None:
    """The loop is skipped for self-sends, without a requester, or when turned off."""
    assert rules.ping_pong_skip_reason(requester, target, max_turns) == reason


def test_primary_run_outcomes() -> None:
    """Failure stops the flow; no reply or a skipped loop announce; else round 1."""
    assert _move(0, "hi", status="error") == Move("stop", "primary_error")
    assert _move(0, None, status="timeout") == Move("stop", "primary_timeout")
    assert _move(0, "REPLY_SKIP") == Move("announce", "no_reply")
    assert _move(0, "hi", skip="self_send") == Move("announce", "self_send")
    assert _move(0, "hi") == Move("round")


def test_rounds_stop_on_reply_skip_empty_failure_or_the_cap() -> None:
    """Exactly REPLY_SKIP (trimmed, case-sensitive) stops; NO_REPLY does not; the cap does."""
    assert _move(1, " REPLY_SKIP\n") == Move("announce", "reply_skip")
    assert _move(1, "reply_skip") == Move("round")
    assert _move(1, "NO_REPLY") == Move("round")
    assert _move(2, "  ") == Move("announce", "empty_reply")
    assert _move(2, "hi", status="error") == Move("announce", "round_error")
    assert _move(2, "hi") == Move("round")
    assert _move(3, "hi") == Move("announce", "max_turns")


def test_message_context_lines() -> None:
    """The primary run's context, with the requester lines only when known."""
    assert rules.message_context("agent:main:main", "discord", "agent:main:hook:x") == (
        "Agent-to-agent message context:\n"
        "Agent 1 (requester) session: agent:main:main.\n"
        "Agent 1 (requester) channel: discord.\n"
        "Agent 2 (target) session: agent:main:hook:x."
    )
    assert rules.message_context(None, None, "main") == (
        "Agent-to-agent message context:\nAgent 2 (target) session: main."
    )


def test_reply_step_prompt_for_the_target() -> None:
    """A target turn names Agent 2 as the current agent and the turn count."""
    prompt = rules.reply_step_prompt(
        speaker="target",
        turn=2,
        max_turns=5,
        requester_key="agent:main:main",
        requester_channel=None,
        target_display="agent:main:discord:group:dev",
        target_channel="discord",
    )
    assert prompt.splitlines() == [
        "Agent-to-agent reply step:",
        "Current agent: Agent 2 (target).",
        "Turn 2 of 5.",
        "Agent 1 (requester) session: agent:main:main.",
        "Agent 2 (target) session: agent:main:discord:group:dev.",
        "Agent 2 (target) channel: discord.",
        'If you want to stop the ping-pong, reply exactly "REPLY_SKIP".',
    ]


def test_announce_prompt_without_replies() -> None:
    """Missing round-1 and latest replies read `(not available).`"""
    prompt = rules.announce_prompt(
        requester_key=None,
        requester_channel=None,
        target_display="main",
        target_channel="unknown",
        original_message="do it",
        round_one_reply=None,
        latest_reply=None,
    )
    assert prompt.splitlines() == [
        "Agent-to-agent announce step:",
        "Agent 2 (target) session: main.",
        "Agent 2 (target) channel: unknown.",
        "Original request: do it",
        "Round 1 reply: (not available).",
        "Latest reply: (not available).",
        'If you want to remain silent, reply exactly "ANNOUNCE_SKIP".',
        "Any other reply will be posted to the target channel.",
        "After this reply, the agent-to-agent conversation is over.",
    ]
