"""`switchboard batch submit | list | status | cancel | results`: the Batches API from the
shell, through the `openai` client pointed at the api (as any OpenAI batch code would be)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, NoReturn

import openai
import typer
from openai.types import Batch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column, Table

from switchboard.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    ConfigOpt,
    TokenOpt,
    UrlOpt,
    _api_base,
    _fail,
    _saved_token,
    _settings,
    app,
    console,
)

batch_app = typer.Typer(
    help="Batches of requests from a JSONL file (OpenAI's Batch API): submit, list, status, "
    "cancel, results.",
    no_args_is_help=True,
)
app.add_typer(batch_app, name="batch")

ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
ENDED = frozenset({"completed", "failed", "cancelled", "expired"})
POLL_S = 0.5
OutOpt = Annotated[Path | None, typer.Option("--out", help="Write the output lines here.")]
ErrorsOpt = Annotated[Path | None, typer.Option("--errors", help="Write the error lines here.")]


def _client(config: Path | None, url: str | None, token: str | None) -> openai.OpenAI:
    """The `openai` client for the api (`--url`/`--token`, else the settings and `up`'s)."""
    settings = _settings(config)
    base = _api_base(settings, url)
    tok = token or settings.token or _saved_token(settings.data_dir.resolve(), create=False)
    if not tok:
        _fail("no token", "set SWITCHBOARD_TOKEN, pass --token, or run `switchboard up` here", 2)
    return openai.OpenAI(base_url=f"{base}/v1", api_key=tok, max_retries=2, timeout=120)


def _api_failed(exc: openai.OpenAIError) -> NoReturn:
    """An api error as one line and its exit code."""
    if isinstance(exc, openai.APIStatusError):
        code = EXIT_USAGE if exc.status_code in (400, 404, 409, 413, 422) else EXIT_REFUSED
        if exc.status_code >= 500:
            code = EXIT_UNAVAILABLE
        _fail(f"HTTP {exc.status_code}", exc.message, code)
    _fail("cannot reach the api", str(exc), EXIT_UNAVAILABLE)


@contextlib.contextmanager
def _calls() -> Iterator[None]:
    try:
        yield
    except openai.OpenAIError as exc:
        _api_failed(exc)


def check_file(path: Path, endpoint: str) -> int:
    """Check a batch file's shape before it is sent (each line: JSON with a unique
    `custom_id`, `method` POST, `url` the endpoint, a `body` object); its request count.
    The first bad line is one line on stderr, exit 2."""
    seen: set[str] = set()
    count = 0
    try:
        handle = path.open("rb")
    except OSError as exc:
        _fail("bad file", f"{path}: {exc.strerror or exc}", EXIT_USAGE)
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            problem = _line_problem(raw, endpoint, seen)
            if problem is not None:
                _fail("bad file", f"{path} line {number}: {problem}", EXIT_USAGE)
            count += 1
    if count == 0:
        _fail("bad file", f"{path}: no requests in it", EXIT_USAGE)
    return count


def _line_problem(raw: bytes, endpoint: str, seen: set[str]) -> str | None:
    try:
        item = json.loads(raw)
    except ValueError:
        return "not valid JSON"
    if not isinstance(item, dict):
        return "not a JSON object"
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "'custom_id' must be a non-empty string"
    if custom_id in seen:
        return f"custom_id {custom_id!r} is used by an earlier line"
    seen.add(custom_id)
    if item.get("method") != "POST":
        return "'method' must be POST"
    if item.get("url") != endpoint:
        return f"'url' must be {endpoint} (the batch's --endpoint)"
    if not isinstance(item.get("body"), dict):
        return "'body' must be a JSON object"
    return None


def _counts(batch: Batch) -> tuple[int, int, int]:
    counts = batch.request_counts
    return (counts.completed, counts.failed, counts.total) if counts else (0, 0, 0)


def _refused(batch: Batch) -> NoReturn:
    """A batch that failed its validation: its first bad line, exit 2."""
    errors = batch.errors.data if batch.errors and batch.errors.data else []
    first = errors[0] if errors else None
    where = f"line {first.line}: " if first is not None and first.line else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    detail = f"{where}{first.message if first else 'refused'}{more}"
    _fail("bad file", f"batch {batch.id} failed validation: {detail}", EXIT_USAGE)


def _wait(client: openai.OpenAI, batch: Batch) -> Batch:
    """Poll the batch to its end with a progress bar (done, failed, total, rate, ETA)."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} done, {task.fields[failed]} failed"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    started = time.monotonic()
    with Progress(*columns, console=console, transient=False) as progress:
        done, failed, total = _counts(batch)
        task = progress.add_task(batch.id, total=total or None, failed=failed, rate="")
        while batch.status not in ENDED:
            time.sleep(POLL_S)
            batch = client.batches.retrieve(batch.id)
            done, failed, total = _counts(batch)
            rate = (done + failed) / max(time.monotonic() - started, 1e-6)
            progress.update(
                task,
                completed=done + failed,
                total=total or None,
                failed=failed,
                rate=f"{rate:.1f}/s",
                description=f"{batch.id} {batch.status}",
            )
    return batch


def _download(client: openai.OpenAI, file_id: str | None, path: Path | None) -> None:
    """Write a result file to ``path`` (stdout without one); nothing when there is none."""
    if file_id is None:
        if path is not None:
            path.write_bytes(b"")
        return
    content = client.files.content(file_id)
    if path is None:
        console.print(content.text, end="", markup=False, highlight=False)
    else:
        content.write_to_file(path)


@batch_app.command("submit")
def submit(
    file: Annotated[Path, typer.Argument(help="JSONL file of requests (OpenAI's batch format).")],
    endpoint: Annotated[str, typer.Option(help="The endpoint of every line.")] = ENDPOINTS[0],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the end, with progress.")] = False,
    out: OutOpt = None,
    errors: ErrorsOpt = None,
    max_concurrent: Annotated[
        int | None, typer.Option(help="Lines running at once (at most batches.maxConcurrent).")
    ] = None,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Upload a file and run it as a batch; with --wait, follow it and save the results."""
    if endpoint not in ENDPOINTS:
        _fail("usage", f"--endpoint must be one of {', '.join(ENDPOINTS)}", EXIT_USAGE)
    check_file(file, endpoint)
    client = _client(config, url, token)
    metadata = {"maxConcurrent": str(max_concurrent)} if max_concurrent else None
    with _calls():
        with file.open("rb") as handle:
            uploaded = client.files.create(file=(file.name, handle), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id,
            endpoint=endpoint,  # type: ignore[arg-type]
            completion_window="24h",
            metadata=metadata,
        )
        if batch.status == "failed":
            _refused(batch)
        if not wait:
            console.print(batch.id, markup=False)
            return
        batch = _wait(client, batch)
        if out is not None:
            _download(client, batch.output_file_id, out)
        if errors is not None:
            _download(client, batch.error_file_id, errors)
    done, failed, total = _counts(batch)
    console.print(f"{batch.id} {batch.status}: {done} done, {failed} failed of {total}")
    raise typer.Exit(EXIT_OK if batch.status == "completed" else EXIT_REFUSED)


@batch_app.command("list")
def list_batches(
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 20,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """This token's batches, newest first."""
    client = _client(config, url, token)
    table = Table(
        Column("id", no_wrap=True),
        Column("status", no_wrap=True),
        "endpoint",
        "done",
        "failed",
        "total",
        "created",
    )
    with _calls():
        page = client.batches.list(limit=min(limit, 100))
        for batch in page.data[:limit]:
            done, failed, total = _counts(batch)
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(batch.created_at))
            table.add_row(
                batch.id, batch.status, batch.endpoint, str(done), str(failed), str(total), created
            )
    console.print(table)


@batch_app.command("status")
def status(
    batch_id: Annotated[str, typer.Argument(help="The batch id.")],
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """One batch as JSON (status, counts, files, times, errors)."""
    client = _client(config, url, token)
    with _calls():
        batch = client.batches.retrieve(batch_id)
    console.print_json(batch.model_dump_json(exclude_none=True))


@batch_app.command("cancel")
def cancel(
    batch_id: Annotated[str, typer.Argument(help="The batch id.")],
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Stop a batch: no more lines start, the running ones are cancelled."""
    client = _client(config, url, token)
    with _calls():
        batch = client.batches.cancel(batch_id)
    console.print(f"{batch.id} {batch.status}", markup=False)


@batch_app.command("results")
def results(
    batch_id: Annotated[str, typer.Argument(help="The batch id.")],
    out: OutOpt = None,
    errors: ErrorsOpt = None,
    config: ConfigOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """An ended batch's output lines (stdout, or --out) and error lines (--errors)."""
    client = _client(config, url, token)
    with _calls():
        batch = client.batches.retrieve(batch_id)
        if batch.status not in ENDED:
            _fail("not ended", f"batch {batch_id} is {batch.status}", EXIT_REFUSED)
        _download(client, batch.output_file_id, out)
        if errors is not None:
            _download(client, batch.error_file_id, errors)
