"""Structured logs: one JSON object per line, bound context, and no credential in the output."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from switchboard.logs import (
    LogFormat,
    configure_structlog,
    configured_secrets,
    formatter,
    log_context,
    run_log_fields,
)
from switchboard.shared.config import Settings, parse_config
from switchboard.shared.store.runs import RunRecord

pytestmark = pytest.mark.unit

TOKEN = "tok-Zq8yXc1-never-logged"
API_KEY = "sk-live-abcdefghijklmnopqrstuvwx"
HOOK_SECRET = "hook-header-secret-77"


class Capture:
    """A root handler with the product's formatter, writing to memory."""

    def __init__(self, fmt: LogFormat = "json", secrets: tuple[str, ...] = ()) -> None:
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
