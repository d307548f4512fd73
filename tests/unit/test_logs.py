"""Structured logs: JSON lines or console lines by terminal, bound context, no credential in
the output, no INFO line for an idle sweep, and expected conditions without tracebacks."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from starlette.requests import ClientDisconnect

from switchboard.logs import (
    Rendering,
    configure_structlog,
    configured_secrets,
    formatter,
    log_context,
    run_log_fields,
    setup_logging,
)
from switchboard.shared.config import Settings, parse_config, reset_caches
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store.runs import RunRecord

pytestmark = pytest.mark.unit

TOKEN = "tok-Zq8yXc1-never-logged"
API_KEY = "sk-live-abcdefghijklmnopqrstuvwx"
HOOK_SECRET = "hook-header-secret-77"


class Capture:
    """A root handler with the product's formatter, writing to memory."""

    def __init__(self, fmt: Rendering = "json", secrets: tuple[str, ...] = ()) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(formatter(fmt, secrets))

    @property
    def text(self) -> str:
        """Everything written so far."""
        return self.stream.getvalue()

    def lines(self) -> list[dict[str, Any]]:
        """Each line, parsed (fails on a line that is not one JSON object)."""
        return [json.loads(line) for line in self.text.splitlines()]


@pytest.fixture
def capture() -> Iterator[Capture]:
    """JSON capture of every record from loggers under `t.`, with the test secrets."""
    configure_structlog()
    cap = Capture(secrets=(TOKEN, API_KEY, HOOK_SECRET))
    logger = logging.getLogger("t")
    logger.addHandler(cap.handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield cap
    logger.removeHandler(cap.handler)


def test_a_stdlib_record_is_one_json_object_with_the_basics_first(capture: Capture) -> None:
    """timestamp, level, logger, event lead; %-args are applied; extras become fields."""
    logging.getLogger("t.run").info("run %s ended: %s", "r1", "ok", extra={"status": "ok"})
    [line] = capture.lines()
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]
    assert line["level"] == "info" and line["logger"] == "t.run"
    assert line["event"] == "run r1 ended: ok"
    assert line["status"] == "ok"
    assert line["timestamp"].endswith("Z")


def test_structlog_loggers_render_the_same_way(capture: Capture) -> None:
    """A structlog logger goes through the same handler, key-value pairs as fields."""
    structlog.get_logger("t.native").warning("queued", runs=3)
    [line] = capture.lines()
    assert (line["level"], line["logger"], line["event"], line["runs"]) == (
        "warning",
        "t.native",
        "queued",
        3,
    )


def test_bound_context_is_on_every_line_inside_the_block_only(capture: Capture) -> None:
    """log_context binds fields (None ones skipped) and restores the previous context."""
    log = logging.getLogger("t.flow")
    with log_context(flowId="f1", turn="1", missing=None):
        log.info("outer")
        with log_context(runId="r9", sessionKey="agent:main:main"):
            log.info("inner")
        log.info("outer again")
    log.info("after")
    outer, inner, again, after = capture.lines()
    assert (outer["flowId"], outer["turn"]) == ("f1", "1") and "missing" not in outer
    assert (inner["flowId"], inner["runId"], inner["sessionKey"]) == ("f1", "r9", "agent:main:main")
    assert "runId" not in again and again["flowId"] == "f1"
    assert "flowId" not in after


def test_a_childs_run_fields_name_its_parent_and_a_flow_run_its_flow() -> None:
    """run_log_fields: runId and sessionKey always; a spawned child's parent and spawn id."""
    child = RunRecord(
        run_id="r-child",
        session_key="agent:main:subagent:abc",
        status="queued",
        message={
            "role": "user",
            "provenance": {"sourceTool": "sessions_spawn", "sourceSessionKey": "agent:main:main"},
        },
        meta={"spawnId": "s-1"},
    )
    assert run_log_fields(child) == {
        "runId": "r-child",
        "sessionKey": "agent:main:subagent:abc",
        "spawnId": "s-1",
        "parentSessionKey": "agent:main:main",
        "spawnedBy": "agent:main:main",
    }
    round_run = RunRecord(
        run_id="r2",
        session_key="agent:main:main",
        status="queued",
        message={"provenance": {"sourceTool": "sessions_send", "sourceSessionKey": "x"}},
        meta={"flowId": "f-7", "a2a": "reply"},
    )
    assert run_log_fields(round_run) == {
        "runId": "r2",
        "sessionKey": "agent:main:main",
        "flowId": "f-7",
    }


def test_configured_secrets_never_reach_the_output(capture: Capture) -> None:
    """In the message, its args, extras, nested fields, context and tracebacks."""
    log = logging.getLogger("t.secret")
    with log_context(header=f"X-Key: {HOOK_SECRET}"):
        log.warning("calling with %s", TOKEN, extra={"detail": {"note": f"key {API_KEY}"}})
    try:
        raise RuntimeError(f"provider rejected {API_KEY} (token {TOKEN})")
    except RuntimeError:
        log.exception("run failed")
    structlog.get_logger("t.native").error("denied", reason=f"bad {TOKEN}", items=[HOOK_SECRET])
    text = capture.text
    for secret in (TOKEN, API_KEY, HOOK_SECRET):
        assert secret not in text
    first, failed, native = capture.lines()
    assert first["event"] == "calling with [REDACTED]"
    assert first["detail"] == {"note": "key [REDACTED]"}
    assert first["header"] == "X-Key: [REDACTED]"
    assert "RuntimeError: provider rejected [REDACTED] (token [REDACTED])" in failed["exception"]
    assert native["reason"] == "bad [REDACTED]" and native["items"] == ["[REDACTED]"]


def test_secret_named_fields_and_credential_shapes_are_masked(capture: Capture) -> None:
    """Fields named like secrets lose their value; bearer tokens and vendor keys are masked
    even when nobody configured them."""
    log = logging.getLogger("t.shape")
    log.info(
        "POST with Authorization: Bearer abcdefghijklmnop1234 and sk-otherkey1234567890abcd",
        extra={"apiKey": "whatever", "Authorization": "Basic dXNlcjpwYXNz", "totalTokens": 12},
    )
    [line] = capture.lines()
    assert line["event"] == "POST with Authorization: Bearer [REDACTED] and sk-[REDACTED]"
    assert (line["apiKey"], line["Authorization"]) == ("[REDACTED]", "[REDACTED]")
    assert line["totalTokens"] == 12  # counts are not secrets


def test_console_format_is_for_humans_and_redacted_too() -> None:
    """`console` renders a readable line (not JSON), still without secrets."""
    cap = Capture("console", secrets=(TOKEN,))
    record = logging.LogRecord("t.c", logging.INFO, __file__, 1, "hello %s", (TOKEN,), None)
    cap.handler.handle(record)
    assert "hello [REDACTED]" in cap.text and TOKEN not in cap.text
    with pytest.raises(json.JSONDecodeError):
        json.loads(cap.text)


def test_configured_secrets_collects_every_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    """Token (settings and config), provider keys, webhook headers, Redis passwords, env keys."""
    monkeypatch.setenv("OPENAI_API_KEY", "env-openai-key")
    settings = Settings(token=TOKEN, redis_url="redis://:redis-pass@h:6379/0")
    config = parse_config(
        {
            "gateway": {"auth": {"token": "config-token"}},
            "models": {"providers": {"p": {"baseUrl": "http://x/v1", "apiKey": API_KEY}}},
            "channels": {"c": {"webhook": {"url": "http://x/h", "headers": {"X": HOOK_SECRET}}}},
        }
    )
    found = configured_secrets(settings, config)
    for secret in (TOKEN, "config-token", API_KEY, HOOK_SECRET, "redis-pass", "env-openai-key"):
        assert secret in found
    # A sentinel URL's own password for the sentinels, in its query.
    sentinel = Settings(token=TOKEN, redis_url="redis+sentinel://s1/m?sentinel_password=sen%26pw")
    assert "sen&pw" in configured_secrets(sentinel, config)


_PROCESS = """
import logging
from celery import Celery
from switchboard.logs import setup_logging
setup_logging("INFO")
app = Celery("t", broker="memory://", set_as_current=False)
app.log.setup(loglevel="INFO")  # what a worker does at start: must not take over
logging.getLogger("celery.task.x").info("celery task line")
logging.getLogger("uvicorn.error").warning("uvicorn line")
try:
    raise ValueError("boom with {token}")
except ValueError:
    logging.getLogger("switchboard.run").exception("run failed")
"""


def _run_process(fmt: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env["SWITCHBOARD_TOKEN"] = TOKEN
    if fmt:
        env["SWITCHBOARD_LOG_FORMAT"] = fmt
    return subprocess.run(
        [sys.executable, "-c", _PROCESS.replace("{token}", TOKEN)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_a_process_logs_json_by_default_and_celery_keeps_its_hands_off() -> None:
    """setup_logging reads the settings: JSON lines, celery's and uvicorn's records included,
    the token (from SWITCHBOARD_TOKEN) redacted, nothing on stdout."""
    done = _run_process(None)
    assert done.stdout == ""
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(line["logger"], line["event"]) for line in lines] == [
        ("celery.task.x", "celery task line"),
        ("uvicorn.error", "uvicorn line"),
        ("switchboard.run", "run failed"),
    ]
    assert "ValueError: boom with [REDACTED]" in lines[2]["exception"]
    assert TOKEN not in done.stderr


def test_switchboard_log_format_console_gives_human_lines() -> None:
    """SWITCHBOARD_LOG_FORMAT=console: readable lines, same records, still redacted."""
    done = _run_process("console")
    assert "celery task line" in done.stderr and "uvicorn line" in done.stderr
    assert not done.stderr.lstrip().startswith("{")
    assert TOKEN not in done.stderr


class FakeStream(io.StringIO):
    """A stream that says whether it is a terminal, as a test asks."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def fresh_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The root logger unconfigured (and the settings re-read); restored afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, getattr(root, "_switchboard", None))
    if hasattr(root, "_switchboard"):
        del root._switchboard
    for name in [k for k in os.environ if k.startswith("SWITCHBOARD_")]:
        monkeypatch.delenv(name)
    reset_caches()
    yield
    root.handlers[:], level, flag = saved
    root.setLevel(level)
    if flag is None:
        if hasattr(root, "_switchboard"):
            del root._switchboard
    else:
        root._switchboard = flag  # type: ignore[attr-defined]
    reset_caches()


def _is_json(text: str) -> bool:
    try:
        json.loads(text.splitlines()[0])
    except json.JSONDecodeError:
        return False
    return True


@pytest.mark.parametrize(
    ("tty", "env", "json_lines"),
    [
        (True, None, False),
        (False, None, True),
        (True, "json", True),
        (True, "auto", False),
        (False, "console", False),
    ],
)
def test_the_renderer_follows_the_terminal_unless_the_setting_says(
    fresh_root: None, monkeypatch: pytest.MonkeyPatch, tty: bool, env: str | None, json_lines: bool
) -> None:
    """SWITCHBOARD_LOG_FORMAT auto (the default): console lines on a terminal, JSON lines
    elsewhere; json or console forces one."""
    if env is not None:
        monkeypatch.setenv("SWITCHBOARD_LOG_FORMAT", env)
    stream = FakeStream(tty)
    setup_logging("INFO", secrets=(), stream=stream)
    logging.getLogger("fresh.renderer").warning("hello")
    assert "hello" in stream.getvalue()
    assert _is_json(stream.getvalue()) is json_lines


def _celery_task_line(logger: str, task: str) -> logging.LogRecord:
    """A record as Celery's worker writes one for a task it ran."""
    msg = "Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s"
    args = {"name": task, "id": "abc", "runtime": 0.01, "return_value": None}
    record = logging.LogRecord(logger, logging.INFO, __file__, 1, msg, (), None)
    record.args = args
    return record


def test_celerys_routine_task_lines_are_debug_and_the_runs_own_line_stays(
    fresh_root: None,
) -> None:
    """Celery's INFO lines about routine task work (beat's send of the sweep, any task's
    receipt and success) are DEBUG; the run's own end line and the sweep's report stay INFO,
    and a task's failure keeps its level."""
    stream = FakeStream(False)
    setup_logging("INFO", "json", secrets=(), stream=stream)
    logging.getLogger("celery.beat").info(
        "Scheduler: Sending due task %s (%s)", "sweep", "switchboard.sweep"
    )
    for task in ("switchboard.sweep", "switchboard.run"):
        received = _celery_task_line("celery.worker.strategy", task)
        received.msg = "Task %(name)s[%(id)s] received"
        logging.getLogger("celery.worker.strategy").handle(received)
        logging.getLogger("celery.app.trace").handle(_celery_task_line("celery.app.trace", task))
    failed = _celery_task_line("celery.app.trace", "switchboard.run")
    failed.msg, failed.levelno, failed.levelname = "Task %(name)s[%(id)s] raised", 40, "ERROR"
    logging.getLogger("celery.app.trace").handle(failed)
    logging.getLogger("switchboard.run").info("run abc ended: ok")
    logging.getLogger("switchboard.sweep").info("sweep recovered requeued=1")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["logger"], line["level"]) for line in lines] == [
        ("celery.app.trace", "error"),
        ("switchboard.run", "info"),
        ("switchboard.sweep", "info"),
    ]


def test_a_python_warning_is_one_line(fresh_root: None) -> None:
    """A captured warning (Celery's about running as root) is one line: category, message
    with its whitespace folded, and file:line; not the source line."""
    stream = FakeStream(False)
    setup_logging("INFO", "json", secrets=(), stream=stream)
    # What logging.captureWarnings hands the `py.warnings` logger for Celery's warning.
    text = warnings.formatwarning(
        "running as root:\nabsolutely not\n\nrecommended!",
        RuntimeWarning,
        "/venv/celery/platforms.py",
        893,
        "_warn_or_raise_security_error(egid, euid, gid, uid,",
    )
    logging.getLogger("py.warnings").warning("%s", text)
    [line] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert line["logger"] == "py.warnings" and line["level"] == "warning"
    assert line["event"] == (
        "RuntimeWarning: running as root: absolutely not recommended! (platforms.py:893)"
    )


def test_at_debug_the_sweeps_celery_lines_are_shown_as_debug(fresh_root: None) -> None:
    """SWITCHBOARD_LOG_LEVEL=DEBUG still shows every sweep, at DEBUG."""
    stream = FakeStream(False)
    setup_logging("DEBUG", "json", secrets=(), stream=stream)
    logging.getLogger("celery.app.trace").handle(
        _celery_task_line("celery.app.trace", "switchboard.sweep")
    )
    [line] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert line["level"] == "debug" and "switchboard.sweep" in line["event"]


def _raise(exc: BaseException, cause: BaseException | None = None) -> None:
    raise exc from cause


@pytest.mark.parametrize(
    "exc",
    [
        StoreUnavailable("connection refused"),
        ConnectionResetError("peer reset"),
        ClientDisconnect(),
        ExceptionGroup("stream", [BrokenPipeError("gone")]),
    ],
    ids=["store", "reset", "client-gone", "group"],
)
def test_an_expected_condition_is_one_warning_line_without_traceback(
    fresh_root: None, exc: Exception
) -> None:
    """Redis or the broker away, a client gone: one WARNING line naming it, no traceback."""
    stream = FakeStream(False)
    setup_logging("INFO", "json", secrets=(), stream=stream)
    try:
        _raise(exc, OSError("Error 111 connecting"))
    except Exception:
        logging.getLogger("fresh.expected").exception("request failed")
    [line] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert line["level"] == "warning" and "exception" not in line
    assert line["event"].startswith(f"request failed: {type(exc).__name__}")
    assert "Traceback" not in stream.getvalue()


def test_a_bug_keeps_its_traceback(fresh_root: None) -> None:
    """An unexpected exception is logged at its level with the whole traceback."""
    stream = FakeStream(False)
    setup_logging("INFO", "json", secrets=(), stream=stream)
    try:
        _raise(KeyError("missing"))
    except KeyError:
        logging.getLogger("fresh.bug").exception("request failed")
    [line] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert line["level"] == "error" and line["event"] == "request failed"
    assert "Traceback" in line["exception"] and "KeyError: 'missing'" in line["exception"]


def test_beats_failed_send_with_the_broker_away_is_one_warning_line(fresh_root: None) -> None:
    """Beat's "Message Error" for a send the broker refused: one WARNING line, its first
    line only (no formatted stack, no traceback)."""
    from celery.beat import SchedulingError
    from kombu.exceptions import OperationalError

    stream = FakeStream(False)
    setup_logging("INFO", "json", secrets=(), stream=stream)
    try:
        try:
            raise OperationalError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
        except OperationalError as exc:
            raise SchedulingError(f"Couldn't apply scheduled task sweep: {exc}")  # noqa: B904
    except SchedulingError as exc:
        logging.getLogger("celery.beat").error(
            "Message Error: %s\n%s", exc, ["  File x, line 1\n"], exc_info=True
        )
    [line] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert line["level"] == "warning" and "exception" not in line
    assert line["event"] == (
        "Message Error: Couldn't apply scheduled task sweep: "
        "Error 111 connecting to 127.0.0.1:1. Connection refused."
    )


def test_celerys_retry_lines_are_warnings(fresh_root: None) -> None:
    """The worker's and beat's "cannot connect, trying again" lines are WARNING, not ERROR,
    a task retried for an unavailable store is WARNING, not INFO; another error line keeps
    its level."""
    stream = FakeStream(False)
    setup_logging("INFO", "json", secrets=(), stream=stream)
    logging.getLogger("celery.worker.consumer.consumer").error(
        "consumer: Cannot connect to %s: %s.\nTrying again %s... (%s/%s)\n",
        "redis://x",
        "refused",
        "in 2.00 seconds",
        1,
        100,
    )
    logging.getLogger("celery.beat").error("beat: Connection error: %s. Trying again", "refused")
    logging.getLogger("celery.beat").error("beat: something else broke")
    logging.getLogger("celery.app.trace").info(
        "Task %(name)s[%(id)s] retry: %(exc)s",
        {"name": "switchboard.run", "id": "r1", "exc": "Retry in 1s: StoreUnavailable()"},
    )
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["level"] for line in lines] == ["warning", "warning", "error", "warning"]
    assert lines[3]["event"] == "Task switchboard.run[r1] retry: Retry in 1s: StoreUnavailable()"
