"""A multipart upload read as it arrives: lines split across chunks, and the limits."""

from __future__ import annotations

from typing import Any, cast

import pytest

from switchboard.api.uploads import MAX_LINE_BYTES, LineUpload, UploadRefused
from switchboard.shared.store.files import FileUpload

pytestmark = pytest.mark.unit

BOUNDARY = b"XyZ"


def form(content: bytes, purpose: bytes = b"batch") -> bytes:
    """A multipart form with a `purpose` field and a `file` part."""
    return (
        b'--XyZ\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' + purpose + b"\r\n"
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n" + content + b"\r\n--XyZ--\r\n"
    )


def feed(upload: LineUpload, body: bytes, chunk: int) -> list[bytes]:
    """Feed the body in chunks of ``chunk`` bytes; every line taken, in order."""
    parser = upload.parser(BOUNDARY)
    lines: list[bytes] = []
    for start in range(0, len(body), chunk):
        parser.write(body[start : start + chunk])
        lines += upload.take_ready()
    parser.finalize()
    return lines + upload.take_ready(force=True)


def new_upload(max_bytes: int = 10**9, max_lines: int = 10**6) -> LineUpload:
    """An upload whose store is never reached (lines are only taken here)."""
    return LineUpload(cast(FileUpload, cast(Any, None)), max_bytes, max_lines)


@pytest.mark.parametrize("chunk", [1, 7, 64 * 1024])
def test_lines_come_out_whole_whatever_the_chunks(chunk: int) -> None:
    """Lines split across chunks come out whole, CRLF endings trimmed, the last line kept
    without its newline; the form's field and the filename are read."""
    upload = new_upload()
    lines = feed(upload, form(b'{"a": 1}\r\n{"b": 2}\n\n{"c": 3}'), chunk)
    assert lines == [b'{"a": 1}', b'{"b": 2}', b"", b'{"c": 3}']
    assert upload.fields == {"purpose": "batch"} and upload.filename == "in.jsonl"
    assert upload.lines == 4 and upload.size == len(b'{"a": 1}\r\n{"b": 2}\n\n{"c": 3}')


def test_limits_refuse_as_the_bytes_arrive() -> None:
    """Past the byte limit, the line limit, or one line's limit, the upload is refused."""
    with pytest.raises(UploadRefused, match="over the limit of 10 bytes"):
        feed(new_upload(max_bytes=10), form(b"x" * 11), 4)
    with pytest.raises(UploadRefused, match="too many lines"):
        feed(new_upload(max_lines=2), form(b"a\nb\nc\n"), 4)
    with pytest.raises(UploadRefused, match="line 1 of the file is over"):
        feed(new_upload(), form(b"y" * (MAX_LINE_BYTES + 1)), 1024 * 1024)
