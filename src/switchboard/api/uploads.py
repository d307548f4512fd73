"""A multipart upload read as it arrives: its file part's lines go to the store a page at a
time, never held whole, and the `batches.*` limits are checked as it comes in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from switchboard.shared.errors import InvalidInput
from switchboard.shared.store.files import FileUpload

# Lines (or bytes) gathered before they are written to the store in one round trip.
FLUSH_LINES = 1000
FLUSH_BYTES = 1024 * 1024
# A form field other than the file (`purpose`) is short.
MAX_FIELD_BYTES = 1024
# One line of a file at most (a request with its whole conversation): a file of one
# endless line is refused before it is held whole.
MAX_LINE_BYTES = 16 * 1024 * 1024


class UploadRefused(InvalidInput):
    """An upload past a limit, or not a multipart form with a file."""


@dataclass
class _Part:
    name: str = ""
    filename: str | None = None
    value: bytearray = field(default_factory=bytearray)


@dataclass
class LineUpload:
    """The state of one multipart upload: its form fields, and its file's lines so far."""

    upload: FileUpload
    max_bytes: int
    max_lines: int
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    size: int = 0
    lines: int = 0
    _partial: bytearray = field(default_factory=bytearray)
    _ready: list[bytes] = field(default_factory=list)
    _ready_bytes: int = 0
    _part: _Part = field(default_factory=_Part)
    _header: tuple[bytearray, bytearray] = field(default_factory=lambda: (bytearray(), bytearray()))
    _headers: dict[str, str] = field(default_factory=dict)

    def parser(self, boundary: bytes) -> MultipartParser:
        """A parser that feeds this upload."""
        callbacks: dict[str, Callable[..., None]] = {
            "on_part_begin": self._begin,
            "on_header_field": lambda d, s, e: self._header[0].extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._header[1].extend(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_done,
            "on_part_data": self._data,
            "on_part_end": self._end,
        }
        return MultipartParser(boundary, callbacks)  # type: ignore[arg-type]

    def _begin(self) -> None:
        self._part = _Part()
        self._headers = {}

    def _header_end(self) -> None:
        name, value = self._header
        self._headers[name.decode("latin-1").lower()] = value.decode("utf-8", "replace")
        name.clear()
        value.clear()

    def _headers_done(self) -> None:
        _, options = parse_options_header(self._headers.get("content-disposition", ""))
        self._part.name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        if filename is not None and self._part.name == "file":
            self._part.filename = filename.decode("utf-8", "replace") or "upload.jsonl"
            self.filename = self._part.filename

    def _data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self._part.filename is None:
            self._part.value.extend(chunk)
            if len(self._part.value) > MAX_FIELD_BYTES:
                raise UploadRefused(f"form field {self._part.name!r} is too long")
            return
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise UploadRefused(
                f"File is too large: it is over the limit of {self.max_bytes} bytes "
                "(batches.maxFileBytes)",
                field="file",
            )
        self._partial.extend(chunk)
        if b"\n" in chunk:
            *whole, rest = bytes(self._partial).split(b"\n")
            self._partial = bytearray(rest)
            for line in whole:
                self._line(line)
        if len(self._partial) > MAX_LINE_BYTES:
            raise UploadRefused(
                f"line {self.lines + 1} of the file is over {MAX_LINE_BYTES} bytes", field="file"
            )

    def _line(self, line: bytes) -> None:
        self.lines += 1
        if self.lines > self.max_lines:
            raise UploadRefused(
                f"File has too many lines: it is over the limit of {self.max_lines} "
                "(batches.maxLines)",
                field="file",
            )
        self._ready.append(line.removesuffix(b"\r"))
        self._ready_bytes += len(line)

    def _end(self) -> None:
        if self._part.filename is None:
            self.fields[self._part.name] = self._part.value.decode("utf-8", "replace")
        elif self._partial:
            self._line(bytes(self._partial))
            self._partial = bytearray()

    def take_ready(self, force: bool = False) -> list[bytes]:
        """The complete lines to write now (a page's worth, or all with ``force``)."""
        if not force and len(self._ready) < FLUSH_LINES and self._ready_bytes < FLUSH_BYTES:
            return []
        ready, self._ready, self._ready_bytes = self._ready, [], 0
        return ready


async def read_upload(request: Request, upload: LineUpload) -> None:
    """Read the request's multipart body into ``upload``, writing its lines as they
    come; on any refusal what was written is dropped."""
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise UploadRefused("the upload must be a multipart/form-data form", field="file")
    parser = upload.parser(boundary)
    try:
        async for chunk in request.stream():
            parser.write(chunk)
            ready = upload.take_ready()
            if ready:
                await run_in_threadpool(upload.upload.append, ready)
        parser.finalize()
        await run_in_threadpool(upload.upload.append, upload.take_ready(force=True))
    except MultipartParseError as exc:
        await run_in_threadpool(upload.upload.abandon)
        raise UploadRefused(f"the multipart form could not be read: {exc}", field="file") from None
    except BaseException:
        await run_in_threadpool(upload.upload.abandon)
        raise
