"""The agent-to-agent rules as pure functions: skip tokens, the prompts, the next move.

The prompt texts are OpenClaw's, line for line (reference §5.3 and §5.6): a bracketed line
appears only when its value is known. Skip tokens are judged on the output of the run that
was asked (exact after trimming, case-sensitive), never on "the latest visible message".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

REPLY_SKIP = "REPLY_SKIP"
ANNOUNCE_SKIP = "ANNOUNCE_SKIP"
NO_REPLY = "NO_REPLY"
CONTROL_TOKENS = frozenset({REPLY_SKIP, ANNOUNCE_SKIP, NO_REPLY})
ANNOUNCE_MESSAGE = "Agent-to-agent announce step."
NOT_AVAILABLE = "(not available)."

Speaker = Literal["requester", "target"]


def visible_reply(text: str | None) -> str | None:
    """A reply worth passing on: trimmed, not empty, not only a control token."""
    cleaned = (text or "").strip()
    if not cleaned or cleaned in CONTROL_TOKENS:
        return None
    return cleaned


def speaker_of(turn: int) -> Speaker:
    """Who speaks a ping-pong turn: the requester on odd turns, the target on even ones."""
    return "requester" if turn % 2 == 1 else "target"


def ping_pong_skip_reason(requester_key: str | None, target_key: str, max_turns: int) -> str | None:
    """Why the reply-back loop does not run at all, or None when it does."""
    if max_turns <= 0:
        return "disabled"
    if not requester_key:
        return "no_requester"
    if requester_key == target_key:
        return "self_send"
    return None


@dataclass(frozen=True)
class Move:
    """What the flow does after a run ended: another round, the announce, or stop."""

    kind: Literal["round", "announce", "stop"]
    reason: str | None = None


def next_move(
    *, turn: int, max_turns: int, skip_reason: str | None, status: str, reply: str | None
) -> Move:
    """Decide the step after the run of ``turn`` ended (turn 0 = the target's primary run).

    The primary run failing ends the flow; without a reply to react to, or with the loop
    skipped, the announce comes next. A round ends the loop when it fails, answers nothing
    or exactly ``REPLY_SKIP``, or reaches ``max_turns``.
    """
    if turn == 0:
        if status != "ok":
            return Move("stop", f"primary_{status}")
        if visible_reply(reply) is None:
            return Move("announce", "no_reply")
        if skip_reason is not None:
            return Move("announce", skip_reason)
        return Move("round")
    if status != "ok":
        return Move("announce", f"round_{status}")
    text = (reply or "").strip()
    if not text:
        return Move("announce", "empty_reply")
    if text == REPLY_SKIP:
        return Move("announce", "reply_skip")
    if turn >= max_turns:
        return Move("announce", "max_turns")
    return Move("round")


def _requester_lines(requester_key: str | None, requester_channel: str | None) -> list[str]:
    lines = []
    if requester_key:
        lines.append(f"Agent 1 (requester) session: {requester_key}.")
    if requester_channel:
        lines.append(f"Agent 1 (requester) channel: {requester_channel}.")
    return lines


def message_context(
    requester_key: str | None, requester_channel: str | None, target_display: str
) -> str:
    """The extra system prompt of the target's primary run."""
    return "\n".join(
        [
            "Agent-to-agent message context:",
            *_requester_lines(requester_key, requester_channel),
            f"Agent 2 (target) session: {target_display}.",
        ]
    )


def reply_step_prompt(
    *,
    speaker: Speaker,
    turn: int,
    max_turns: int,
    requester_key: str | None,
    requester_channel: str | None,
    target_display: str,
    target_channel: str,
) -> str:
    """The extra system prompt of one ping-pong round."""
    current = "Agent 1 (requester)" if speaker == "requester" else "Agent 2 (target)"
    return "\n".join(
        [
            "Agent-to-agent reply step:",
            f"Current agent: {current}.",
            f"Turn {turn} of {max_turns}.",
            *_requester_lines(requester_key, requester_channel),
            f"Agent 2 (target) session: {target_display}.",
            f"Agent 2 (target) channel: {target_channel}.",
            f'If you want to stop the ping-pong, reply exactly "{REPLY_SKIP}".',
        ]
    )


def announce_prompt(
    *,
    requester_key: str | None,
    requester_channel: str | None,
    target_display: str,
    target_channel: str,
    original_message: str,
    round_one_reply: str | None,
    latest_reply: str | None,
) -> str:
    """The extra system prompt of the announce run on the target session."""
    return "\n".join(
        [
            "Agent-to-agent announce step:",
            *_requester_lines(requester_key, requester_channel),
            f"Agent 2 (target) session: {target_display}.",
            f"Agent 2 (target) channel: {target_channel}.",
            f"Original request: {original_message}",
            f"Round 1 reply: {round_one_reply or NOT_AVAILABLE}",
            f"Latest reply: {latest_reply or NOT_AVAILABLE}",
            f'If you want to remain silent, reply exactly "{ANNOUNCE_SKIP}".',
            "Any other reply will be posted to the target channel.",
            "After this reply, the agent-to-agent conversation is over.",
        ]
    )
