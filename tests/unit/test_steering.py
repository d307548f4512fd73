"""Steered messages as a run's model sees them and as its transcript keeps them."""

from __future__ import annotations

from pydantic_ai.messages import UserPromptPart

from switchboard.shared.runtime.steering import request_parts, restore_steered

STEERED = {
    "role": "user",
    "content": "look at the logs first",
    "timestamp": 1_700_000_000_000,
    "provenance": {
        "kind": "inter_session",
        "sourceTool": "sessions_send",
        "sourceSessionKey": "agent:main:main",
        "mode": "steer",
    },
}


def test_the_model_is_shown_a_steered_message_with_its_inter_session_line() -> None:
    """A steered message reaches the model as a user prompt led by OpenClaw's prefix."""
    [part] = request_parts([STEERED])
    assert isinstance(part, UserPromptPart)
    first, _, rest = str(part.content).partition("\n")
    assert first.startswith("[Inter-session message] sourceSession=agent:main:main")
    assert rest == "look at the logs first"


def test_the_transcript_keeps_a_steered_message_as_it_was_sent() -> None:
    """The run's user message shown with the prefix is written back as the steered entry
    (content and provenance); other messages, and a same-text message past the steered
    ones, stay as they are."""
    [part] = request_parts([STEERED])
    shown = {"role": "user", "content": part.content, "timestamp": 1}
    tool = {"role": "toolResult", "toolCallId": "c1", "content": []}
    out = restore_steered([tool, shown, dict(shown)], [STEERED])
    assert out[0] == tool
    assert out[1] == STEERED
    assert out[2] == shown
