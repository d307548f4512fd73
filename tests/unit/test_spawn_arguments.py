"""sessions_spawn's newer parameters, the pure parts: attachment validation (OpenClaw's
codes and limits), how attachments reach the model and leave transcripts, and the
non-negative integer reader."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from pydantic_ai.messages import ModelResponse, ToolCallPart

from switchboard.shared.errors import InvalidInput
from switchboard.shared.runtime import attachments as att
from switchboard.shared.runtime.transcript import to_transcript
from switchboard.shared.tools.args import read_non_negative_int

pytestmark = pytest.mark.unit


def test_prepare_keeps_valid_attachments_with_their_sizes() -> None:
    raw = [
        {"name": "notes.txt", "content": "héllo"},
        {
            "name": "img.png",
            "content": base64.b64encode(b"\x89PNG").decode(),
            "encoding": "base64",
            "mimeType": "image/png",
        },
    ]
    out = att.prepare(raw)
    assert [(a.name, a.encoding, a.bytes, a.mime_type) for a in out] == [
        ("notes.txt", "utf8", 6, ""),
        ("img.png", "base64", 4, "image/png"),
    ]
    assert att.prepare(None) == []


def _error(raw: Any) -> str:
    with pytest.raises(att.AttachmentError) as caught:
        att.prepare(raw)
    return str(caught.value)


def test_total_bytes_are_bounded_across_attachments() -> None:
    chunk = "x" * att.MAX_FILE_BYTES
    raw = [{"name": f"f{i}.txt", "content": chunk} for i in range(6)]
    assert _error(raw) == (
        f"attachments_total_bytes_exceeded (attachmentIndex=5 totalBytes={6 * len(chunk)} "
        f"maxTotalBytes={att.MAX_TOTAL_BYTES})"
    )
    assert len(att.prepare(raw[:5])) == 5


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("nope", "attachments_invalid_member (expected array)"),
        ([1], "attachments_invalid_member (expected object)"),
        (
            [{"name": "a", "content": 5}],
            "attachments_invalid_member (name and content must be strings)",
        ),
        ([{"name": "", "content": "x"}], "attachments_invalid_name (attachmentIndex=0 empty)"),
        (
            [{"name": " a", "content": "x"}],
            "attachments_invalid_name (attachmentIndex=0 leading or trailing whitespace)",
        ),
        ([{"name": "a.", "content": "x"}], "attachments_invalid_name (attachmentIndex=0 name=a.)"),
        (
            [{"name": "a", "content": "x", "mimeType": 3}],
            "attachments_invalid_member (attachmentIndex=0 reason=mime_type_not_string)",
        ),
        # Not canonical base64 (padding bits set), and not a multiple of four.
        (
            [{"name": "a", "content": "QR==", "encoding": "base64"}],
            "attachments_invalid_base64_or_too_large (attachmentIndex=0)",
        ),
        (
            [{"name": "a", "content": "QUJD=", "encoding": "base64"}],
            "attachments_invalid_base64_or_too_large (attachmentIndex=0)",
        ),
    ],
)
def test_prepare_refuses_with_openclaw_codes(raw: Any, error: str) -> None:
    assert _error(raw) == error


def test_with_attachments_extends_only_the_runs_message_for_the_model() -> None:
    message = {"role": "user", "content": "[Subagent Task]: read", "timestamp": 5}
    history = [
        {"role": "user", "content": "[Subagent Task]: read", "timestamp": 4},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}], "timestamp": 4},
        dict(message),
    ]
    stored = [
        att.Attachment("a.txt", "alpha", "utf8", "text/plain", 5).to_json(),
        att.Attachment("b.bin", base64.b64encode(b"\xff\x00").decode(), "base64", "", 2).to_json(),
        att.Attachment("c.md", base64.b64encode(b"# title").decode(), "base64", "", 7).to_json(),
    ]
    out = att.with_attachments(history, message, stored)
    assert out[:2] == history[:2]  # an older message with the same text is left alone
    text = out[2]["content"]
    assert text.startswith("[Subagent Task]: read\n\nAttachments: 3 file(s), 14 bytes.")
    assert '<<<attachment name="a.txt" mimeType=text/plain bytes=5>>>\nalpha' in text
    assert f"bytes=2 binary=base64>>>\n{stored[1]['content']}" in text
    assert '<<<attachment name="c.md" bytes=7>>>\n# title\n<<<end attachment>>>' in text
    assert history[2]["content"] == "[Subagent Task]: read"  # the input is not changed


def test_stored_spawn_tool_calls_carry_the_redaction_marker() -> None:
    args = {
        "task": "t",
        "attachments": [{"name": "a", "content": "SECRET"}],
        "tasks": [{"task": "u", "attachments": [{"name": "b", "content": "SECRET2"}]}],
    }
    response = ModelResponse(parts=[ToolCallPart("sessions_spawn", args, tool_call_id="c1")])
    [stored] = to_transcript([response], model="m", provider="p")
    arguments = stored["content"][0]["arguments"]
    assert "SECRET" not in str(arguments)
    assert arguments["attachments"] == [{"name": "a", "content": att.REDACTED}]
    assert arguments["tasks"][0]["attachments"][0]["content"] == att.REDACTED
    other = ModelResponse(parts=[ToolCallPart("lookup", {"attachments": [{"content": "x"}]})])
    [kept] = to_transcript([other], model="m", provider="p")
    assert kept["content"][0]["arguments"] == {"attachments": [{"content": "x"}]}


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("", None), ("  ", None), (0, 0), (30, 30), (2.0, 2), ("45", 45)],
)
def test_non_negative_int_accepts(value: Any, expected: int | None) -> None:
    assert read_non_negative_int({"runTimeoutSeconds": value}, "runTimeoutSeconds") == expected


@pytest.mark.parametrize("value", [-1, 1.5, "soon", True, float("inf"), [3]])
def test_non_negative_int_refuses(value: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        read_non_negative_int({"timeout_seconds": value}, "timeoutSeconds")
    assert caught.value.message == "timeoutSeconds must be a non-negative integer"
