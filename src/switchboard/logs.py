"""Logging for every process: one JSON object per line, or a console line for humans.

``setup_logging`` puts one handler on the root logger whose structlog ``ProcessorFormatter``
renders structlog's own loggers and stdlib records alike (the product's loggers, celery,
uvicorn): ``timestamp``, ``level``, ``logger``, ``event``, the record's ``extra`` fields and
the context bound with ``log_context`` (``runId``, ``sessionKey``, ``flowId``, …).
``SWITCHBOARD_LOG_FORMAT`` picks ``console`` (lines for a human), ``json`` (for collectors)
or ``auto`` (the default: console on a terminal, JSON otherwise).

What an idle stack, a run and an expected condition write is kept short: Celery's INFO
lines about a task's routine receipt and success (and beat's sending of the periodic sweep)
are DEBUG lines, so a run is the one INFO line of its end and a stack with nothing to do
writes nothing at INFO; a record carrying an expected condition (the store or broker
briefly away, a client that went away) is one WARNING line, its exception summed up in the
message, with no traceback; a Python warning (Celery's about running as root) is one line
naming its category and where it was raised. Tracebacks are for bugs.

Credentials never reach the output: just before rendering, the values of the configured
secrets (api token, provider keys, webhook headers, Redis passwords), every field named
like a secret (``token``, ``apiKey``, ``authorization``, …) and credential-looking text
(``switchboard/redact.py``: bearer tokens, ``sk-…`` keys, ``api_key=…``) become
``[REDACTED]``, in the message, the fields and exception tracebacks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TextIO
from urllib.parse import parse_qsl, urlsplit

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from switchboard.redact import REDACTED, redact_text
from switchboard.shared.errors import Unavailable

if TYPE_CHECKING:
    from switchboard.shared.config import Settings, SwitchboardConfig

LogFormat = Literal["auto", "json", "console"]
# What a line is rendered as once `auto` is settled.
Rendering = Literal["json", "console"]


class LoggedRun(Protocol):
    """What a run's log fields are read from (a `RunRecord`; logging knows no store)."""

    @property
    def run_id(self) -> str: ...
    @property
    def session_key(self) -> str: ...
    @property
    def message(self) -> Mapping[str, Any] | None: ...
    @property
    def meta(self) -> Mapping[str, Any]: ...


# Field names whose values are always secret (the whole value is replaced).
_SECRET_FIELD_RE = re.compile(
    r"(api[_-]?key|token|secret|password|passwd|authorization|cookie)$", re.IGNORECASE
)
# A configured secret shorter than this is not searched for (it would mangle every line).
_MIN_SECRET_LEN = 4
# Environment variables read by model clients (their values are secrets too).
_SECRET_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
_NOISY_LOGGERS = ("httpx", "httpcore", "openai", "anthropic")
_BASICS = ("timestamp", "level", "logger", "event")
# Extra fields some libraries add that only repeat the event (uvicorn's ANSI-coloured copy).
_DROPPED_FIELDS = frozenset({"color_message"})
# Periodic tasks whose every run beat would log at INFO (its send): a line per sweep
# interval on a stack with nothing to do.
PERIODIC_TASKS = ("switchboard.sweep",)
# Celery's INFO lines about every task's routine receipt and success, by logger: the run's
# own end line says what happened, once (Celery's message formats, celery.app.trace).
_ROUTINE_TASK_LINES = (
    ("celery.worker.strategy", "Task %(name)s[%(id)s] received"),
    ("celery.app.trace", "Task %(name)s[%(id)s] succeeded"),
)
# A formatted Python warning: "path:line: Category: message\n  source line\n".
_WARNING_RE = re.compile(
    r"^(?P<path>.*?):(?P<line>\d+): (?P<category>\w+): (?P<text>.*?)\n  ", re.S
)
# Exceptions that are conditions of the environment, not bugs (by class path, so logging
# imports none of these libraries): Redis or the broker away, a client that went away.
_EXPECTED_CLASSES = frozenset(
    {
        "redis.exceptions.ConnectionError",
        "redis.exceptions.TimeoutError",
        "kombu.exceptions.OperationalError",
        "starlette.requests.ClientDisconnect",
        "anyio.BrokenResourceError",
        "anyio.ClosedResourceError",
    }
)
# Exceptions that wrap what happened while handling another (beat's failed send): expected
# when the exception they were raised from is.
_WRAPPER_CLASSES = frozenset({"celery.beat.SchedulingError"})
# Celery's own lines (no exception attached) about a dependency being away, each a
# WARNING: its reconnection attempts to the broker (ERROR lines) and a task retried (INFO;
# tasks retry only `Unavailable`): (logger, message start).
_RETRY_LINES = (
    ("celery.worker.consumer.consumer", "consumer: Cannot connect"),
    ("celery.beat", "beat: Connection error"),
    ("celery.app.trace", "Task %(name)s[%(id)s] retry"),
)


def setup_logging(
    level: str = "INFO",
    fmt: LogFormat | None = None,
    *,
    secrets: Iterable[str] | None = None,
    stream: TextIO | None = None,
) -> None:
    """Configure the process's logging once: the root handler, structlog, celery's hands off.

    ``fmt`` and ``secrets`` default to the process's settings and config; ``stream``
    (default: stderr at the time of each record) also settles ``auto`` (`resolve_format`)."""
    root = logging.getLogger()
    if getattr(root, "_switchboard", False):
        return
    if fmt is None or secrets is None:
        from switchboard.shared.config import get_config, get_settings

        settings = get_settings()
        fmt = fmt or settings.log_format
        if secrets is None:
            secrets = configured_secrets(settings, get_config(settings.config))
    configure_structlog()
    target = stream or sys.stderr
    handler = logging.StreamHandler(stream) if stream else _StderrHandler()
    rendering = resolve_format(fmt, target)
    handler.setFormatter(formatter(rendering, secrets, colors=_isatty(target)))
    handler.addFilter(QuietRoutine())
    handler.addFilter(OneLineWarnings())
    handler.addFilter(ExpectedConditions())
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in _NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # warnings become records of the `py.warnings` logger
    _keep_celery_off_logging()
    root._switchboard = True  # type: ignore[attr-defined]


def resolve_format(fmt: LogFormat, stream: TextIO) -> Rendering:
    """``auto`` is console lines when ``stream`` is a terminal, JSON lines otherwise."""
    if fmt != "auto":
        return fmt
    return "console" if _isatty(stream) else "json"


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(callable(isatty) and isatty())


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of the record, not at set-up."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def _shared_processors() -> list[Processor]:
    """What every record gets before rendering, structlog's or stdlib's."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]


def configure_structlog() -> None:
    """Route structlog's loggers into stdlib logging (and so into the root handler)."""
    structlog.configure(
        processors=[
            *_shared_processors(),
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def formatter(
    fmt: Rendering = "json", secrets: Iterable[str] = (), *, colors: bool = False
) -> logging.Formatter:
    """The root handler's formatter: shared processors, redaction, then the renderer."""
    renderer: Processor
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(
            colors=colors, exception_formatter=structlog.dev.plain_traceback
        )
    else:
        renderer = structlog.processors.JSONRenderer(default=str)
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_shared_processors(), structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,  # tracebacks as text, so they are redacted
            Redactor(secrets),
            _tidy,
            renderer,
        ],
    )


def _tidy(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Order a line as timestamp, level, logger, event, then the rest; drop empty fields."""
    first = {k: event_dict.pop(k) for k in _BASICS if k in event_dict}
    rest = {k: v for k, v in event_dict.items() if v is not None and k not in _DROPPED_FIELDS}
    return {**first, **rest}


class QuietRoutine(logging.Filter):
    """Celery's INFO lines about routine task work (every task's receipt and success,
    beat's send of the periodic sweep) become DEBUG lines, shown only when the root logger
    is at DEBUG: a run writes its own end line and an idle stack nothing at INFO. Failures
    and retries keep their level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not _routine(record):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def _routine(record: logging.LogRecord) -> bool:
    """Whether the record is one of Celery's routine task lines (`QuietRoutine`)."""
    message = str(record.msg)
    if any(
        record.name == name and message.startswith(start) for name, start in _ROUTINE_TASK_LINES
    ):
        return True
    return record.name == "celery.beat" and any(t in record.getMessage() for t in PERIODIC_TASKS)


class OneLineWarnings(logging.Filter):
    """A Python warning captured into logging (`py.warnings`) becomes one line: its
    category and message, whitespace folded, and where it was raised; the source line that
    `warnings` appends is left out."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "py.warnings":
            return True
        found = _WARNING_RE.match(record.getMessage())
        if found is not None:
            text = " ".join(found["text"].split())
            where = f"{os.path.basename(found['path'])}:{found['line']}"
            record.msg, record.args = f"{found['category']}: {text} ({where})", None
        return True


class ExpectedConditions(logging.Filter):
    """A record whose exception is an expected condition (`expected_condition`) becomes
    one WARNING line naming the exception, without its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and expected_condition(exc):
            # The first line only: beat appends a formatted stack to its message.
            message = record.getMessage().split("\n", 1)[0]
            named = bool(str(exc)) and str(exc) in message  # beat's line names it already
            record.msg = message if named else f"{message}: {_summary(exc)}"
            record.args = None
            record.exc_info = record.exc_text = None
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        elif _retry_line(record):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _retry_line(record: logging.LogRecord) -> bool:
    """Whether the record is Celery's line about retrying what is away (`_RETRY_LINES`)."""
    return any(
        record.name == name and str(record.msg).startswith(start) for name, start in _RETRY_LINES
    )


def expected_condition(exc: BaseException) -> bool:
    """Whether an exception is the environment's doing (a store, broker or client that is
    away) rather than a bug; a group is expected when all it holds is."""
    if isinstance(exc, BaseExceptionGroup):
        return all(expected_condition(inner) for inner in exc.exceptions)
    if isinstance(exc, Unavailable | ConnectionError):
        return True
    if _class_path_in(exc, _WRAPPER_CLASSES):
        inner = exc.__cause__ or exc.__context__
        return inner is not None and expected_condition(inner)
    return _class_path_in(exc, _EXPECTED_CLASSES)


def _class_path_in(exc: BaseException, paths: frozenset[str]) -> bool:
    """Whether the exception's class, or one it derives from, is named in ``paths``."""
    return any(f"{cls.__module__}.{cls.__qualname__}" in paths for cls in type(exc).__mro__)


def _summary(exc: BaseException) -> str:
    """The exception's class and message, with the cause a translated one carries."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"{text} ({exc.__cause__})" if exc.__cause__ is not None else text


class Redactor:
    """A processor replacing secrets in every value of the event (recursively)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret containing another is replaced whole.
        self.secrets = sorted(
            {s for s in secrets if s and len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True
        )

    def __call__(self, _: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        for key, value in event_dict.items():
            event_dict[key] = self._clean(key, value)
        return event_dict

    def _clean(self, key: str, value: Any) -> Any:
        if isinstance(value, str):
            return REDACTED if _SECRET_FIELD_RE.search(key) else self.text(value)
        if isinstance(value, Mapping):
            return {str(k): self._clean(str(k), v) for k, v in value.items()}
        if isinstance(value, list | tuple | set):
            return [self._clean(key, v) for v in value]
        if isinstance(value, int | float | bool) or value is None:
            return value
        return self._clean(key, str(value))

    def text(self, text: str) -> str:
        """The text with configured secrets and credential-looking strings masked."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return redact_text(text)


def configured_secrets(settings: Settings, config: SwitchboardConfig) -> list[str]:
    """Every credential the process knows: token, provider keys, webhook headers, passwords."""
    found = [settings.token, config.gateway.auth.token]
    found += [provider.api_key for provider in config.models.providers.values()]
    for channel in config.channels.values():
        if channel.webhook is not None:
            found += channel.webhook.headers.values()
    for url in (settings.redis_url, settings.broker_url):
        parts = urlsplit(url or "")
        found.append(parts.password)
        # A password in the query (a sentinel URL's `sentinel_password`).
        found += [v for k, v in parse_qsl(parts.query) if k.endswith("password")]
    found += [os.environ.get(name) for name in _SECRET_ENV]
    return [secret for secret in found if secret]


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Bind fields (None ones skipped) to every log line emitted inside the block."""
    with structlog.contextvars.bound_contextvars(
        **{k: v for k, v in fields.items() if v is not None}
    ):
        yield


def run_log_fields(rec: LoggedRun) -> dict[str, Any]:
    """What a run's log lines carry: its ids, its flow, and for a child its parent."""
    fields: dict[str, Any] = {"runId": rec.run_id, "sessionKey": rec.session_key}
    for name in ("flowId", "spawnId", "batchId"):
        if rec.meta.get(name):
            fields[name] = str(rec.meta[name])
    provenance: Mapping[str, Any] = (rec.message or {}).get("provenance") or {}
    if provenance.get("sourceTool") == "sessions_spawn" and provenance.get("sourceSessionKey"):
        parent = str(provenance["sourceSessionKey"])
        fields["parentSessionKey"] = fields["spawnedBy"] = parent
    return fields


def bind_run(rec: LoggedRun) -> None:
    """Bind a run's fields for the rest of the current asyncio task.

    ``execute_run`` / ``resume_run`` each run as their own task (the worker's
    ``run_until_complete``), whose context is a copy: the binding ends with the run."""
    structlog.contextvars.bind_contextvars(**run_log_fields(rec))


def _keep_celery_off_logging() -> None:
    """Tell celery (worker, beat) that logging is configured: it then adds no handler of
    its own and does not redirect stdout."""
    from celery.signals import setup_logging as celery_setup_logging

    def configured(**_: Any) -> None:
        return None

    celery_setup_logging.connect(configured, weak=False)
