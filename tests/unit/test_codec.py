"""Hash-field encoding: JSON that never fails on what a model may put in a tool call."""

from __future__ import annotations

import pytest

from switchboard.shared.store import codec

pytestmark = pytest.mark.unit


def test_integers_beyond_64_bits_are_written_not_refused() -> None:
    """A tool call with a huge integer (models do produce them) must not crash the run's end."""
    message = {"role": "assistant", "content": [{"type": "toolCall", "arguments": {"n": 2**70}}]}
    text = codec.dumps(message)
    assert '"n":1180591620717411303424' in text
    assert codec.loads(text)["content"][0]["arguments"]["n"] == pytest.approx(2.0**70)


def test_the_fallback_writes_non_finite_floats_as_null_like_the_fast_path() -> None:
    value = {"big": -(2**80), "nan": float("nan"), "inf": [float("inf")], "t": (1, "x")}
    assert codec.loads(codec.dumps(value)) == {
        "big": pytest.approx(-(2.0**80)),
        "nan": None,
        "inf": [None],
        "t": [1, "x"],
    }
    assert codec.dumps({"nan": float("nan")}) == '{"nan":null}'


def test_a_flat_hash_reply_decodes_from_bytes_text_or_both() -> None:
    assert codec.decode_flat_hash([b"status", b"ok", b"reply", "h\u00e9".encode()]) == {
        "status": "ok",
        "reply": "h\u00e9",
    }
    assert codec.decode_flat_hash(["status", "ok"]) == {"status": "ok"}
    # A client that decodes some replies itself: text after bytes, and bytes after text.
    assert codec.decode_flat_hash([b"a", "1", "b", b"2"]) == {"a": "1", "b": "2"}
    assert codec.decode_flat_hash([]) == {}


def test_text_fields_keep_none_as_a_deletion_and_encode_the_rest_as_text() -> None:
    """A run-start record's fields go to Lua as text, None meaning 'delete the field'."""
    fields = codec.text_fields({"a": 1, "b": True, "c": None, "d": {"x": 1}, "e": "s"})
    assert fields == {"a": "1", "b": "1", "c": None, "d": '{"x":1}', "e": "s"}
    assert codec.fields_json({"c": None}) == '{"c":null}'


def test_as_text_reads_bytes_text_numbers_and_nothing() -> None:
    """A Redis reply element as text: bytes decoded, None as ''."""
    assert [codec.as_text(v) for v in (b"r1", "r2", 3, None)] == ["r1", "r2", "3", ""]
