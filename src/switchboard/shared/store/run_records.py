"""What the run store takes and answers: run records, new runs, claims and outcomes.

A run may be started with a record written in the same step (`NewRun.link`,
`LinkRecord`, `LinkAdvance`): a hash the store writes for its caller without knowing
what it is, so the record exists exactly when the run does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from switchboard.shared.errors import Conflict
from switchboard.shared.store import codec
from switchboard.shared.store.windows import HistoryEntry

RunStatus = Literal["queued", "running", "parked", "ok", "error", "timeout", "cancelled", "lost"]
# `cancelled`: ended by `subagents cancel`; `lost`: its worker vanished with no retry left.
TERMINAL: frozenset[str] = frozenset({"ok", "error", "timeout", "cancelled", "lost"})
# The run ledger's state of each stored status (OpenClaw's task states); a parked run is
# still running (it waits on a tool, holding no worker).
LEDGER_STATES: Mapping[str, str] = {
    "queued": "queued",
    "running": "running",
    "parked": "running",
    "ok": "succeeded",
    "error": "failed",
    "timeout": "timed_out",
    "cancelled": "cancelled",
    "lost": "lost",
}


# The ledger's terminal states.
LEDGER_TERMINAL: tuple[str, ...] = ("succeeded", "failed", "timed_out", "cancelled", "lost")


def ledger_state(status: str) -> str:
    """The ledger state of a stored run status (an unknown status passes through)."""
    return LEDGER_STATES.get(status, status)


def now_ms() -> int:
    """Wall-clock time in milliseconds."""
    return int(time.time() * 1000)


@dataclass
class RunRecord:
    """A run as stored in its hash."""

    run_id: str
    session_key: str
    status: str
    created_at_ms: int | None = None
    started_at_ms: int | None = None
    ended_at_ms: int | None = None
    deadline_at_ms: int | None = None
    timeout_s: float | None = None
    attempt: int = 0
    message: dict[str, Any] | None = None
    extra_system_prompt: str | None = None
    reply: str | None = None
    error: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    channel: str | None = None
    kind: str = "agent"
    parked: list[dict[str, Any]] = field(default_factory=list)
    # A spawned child's inline attachments (given to its model, never to its transcript),
    # kept while the run lives: its end step deletes them.
    attachments: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    on_end: dict[str, Any] | None = None
    # The run ended its turn with `sessions_yield` (status ok): its session waits for its
    # children's announces, which start its next run.
    yielded: bool = False
    # The run that continues a yielded run: its wake's (named once, as the wake run starts).
    wake_run_id: str | None = None
    # When `subagents cancel` asked for this running run to stop (ms; None: not asked).
    cancel_at_ms: int | None = None
    # The trace context the run was created in (W3C traceparent; None: tracing off): its
    # execution joins that trace (`switchboard.telemetry`).
    traceparent: str | None = None
    # A request's client-side tools (`runtime.client_tools`): their definitions and the
    # request's tool choice, offered to the model beside the agent's own.
    client_tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = None
    # The client's results for the calls the session's previous run ended on (a run
    # that continues it has no user message: these join its history).
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    # The client-side calls the run ended on (status ok): {id, name, arguments}.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # Hashes the run's end step read for its follow-up step (Redis key -> decoded fields;
    # an absent hash is {}): the step takes them instead of reading them again.
    read_at_end: Mapping[str, Mapping[str, str]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def terminal(self) -> bool:
        """True once the run has an outcome."""
        return self.status in TERMINAL

    @property
    def state(self) -> str:
        """The run's ledger state (`ledger_state`)."""
        return ledger_state(self.status)

    @property
    def cancel_requested(self) -> bool:
        """`subagents cancel` asked the worker executing this run to stop it."""
        return self.cancel_at_ms is not None

    @classmethod
    def unseen(cls, run_id: str) -> RunRecord:
        """A run its caller started whose state could not be read (the store away): not
        ended, as far as anyone can tell (status ``unknown``)."""
        return cls(run_id=run_id, session_key="", status="unknown")

    @classmethod
    def from_hash(cls, run_id: str, h: Mapping[str, str]) -> RunRecord:
        """Build from a decoded HGETALL reply."""
        timeout = h.get("timeoutS")
        return cls(
            run_id=run_id,
            session_key=h.get("sessionKey", ""),
            status=h.get("status", "queued"),
            created_at_ms=codec.as_int(h.get("createdAt")),
            started_at_ms=codec.as_int(h.get("startedAt")),
            ended_at_ms=codec.as_int(h.get("endedAt")),
            deadline_at_ms=codec.as_int(h.get("deadlineAt")),
            timeout_s=float(timeout) if timeout else None,
            attempt=codec.as_int(h.get("attempt")) or 0,
            message=codec.as_json(h.get("message")),
            extra_system_prompt=h.get("extraSystemPrompt"),
            reply=h.get("reply"),
            error=h.get("error"),
            usage=codec.as_json(h.get("usage"), {}),
            model=h.get("model"),
            channel=h.get("channel"),
            kind=h.get("kind", "agent"),
            parked=codec.as_json(h.get("parked"), []),
            attachments=codec.as_json(h.get("attachments"), []),
            meta=codec.as_json(h.get("meta"), {}),
            on_end=codec.as_json(h.get("onEnd")),
            yielded=h.get("yielded") == "1",
            wake_run_id=h.get("wakeRunId") or None,
            cancel_at_ms=codec.as_int(h.get("cancelRequested")),
            traceparent=h.get("traceparent"),
            client_tools=codec.as_json(h.get("clientTools"), []),
            tool_choice=codec.as_json(h.get("toolChoice")),
            tool_results=codec.as_json(h.get("toolResults"), []),
            tool_calls=codec.as_json(h.get("toolCalls"), []),
        )

    def outcome(self) -> dict[str, Any]:
        """The public outcome as `agent.wait` reports it."""
        out: dict[str, Any] = {"runId": self.run_id, "status": self.status}
        if self.status not in TERMINAL:
            out["status"] = "timeout"
            out["pending"] = self.status
            return out
        if self.reply is not None and self.status == "ok":
            out["reply"] = self.reply
        if self.error:
            out["error"] = self.error
        if self.started_at_ms:
            out["startedAt"] = self.started_at_ms
        if self.ended_at_ms:
            out["endedAt"] = self.ended_at_ms
        return out


@dataclass(frozen=True)
class NewRun:
    """What a caller supplies to start a run."""

    run_id: str
    session_key: str
    message: dict[str, Any] | None
    timeout_s: float
    extra_system_prompt: str | None = None
    model: str | None = None
    channel: str | None = None
    kind: str = "agent"
    meta: Mapping[str, Any] = field(default_factory=dict)
    # A follow-up task enqueued (durably, via the outbox) when the run ends:
    # {"task": "<celery task name>", "args": ["<id>", ...]}.
    on_end: Mapping[str, Any] | None = None
    # (hash key, field): a record written with the run. The run's id is named in that
    # field of that hash as the run is recorded, unless the field is set already (first
    # writer wins). The store does not know what the hash is; its owner does.
    link: tuple[str, str] | None = None
    # A new record at the link's hash, written in the same step as the run.
    link_record: LinkRecord | None = None
    # A compare-and-set on the link's hash, made in the same step; the run is recorded only
    # if it holds (`LinkAdvance`).
    link_advance: LinkAdvance | None = None
    # Someone will wait for the run's end: it is published on the run-ended channel (an
    # unwatched run's end is published only if a waiter marks it first, watch_run.lua).
    watched: bool = False
    # Inline attachments for the run's model (`runtime.attachments`), deleted at its end.
    attachments: Sequence[Mapping[str, Any]] = ()
    # A request's client-side tools, its tool choice, and its results for the calls the
    # session's previous run ended on (see `RunRecord`).
    client_tools: Sequence[Mapping[str, Any]] = ()
    tool_choice: Any = None
    tool_results: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class LinkRecord:
    """A record created in the step that records the run linking to it (a record and its
    first run: one round trip, not two). ``fields`` are text values; the hash is kept
    ``ttl_s``; ``member`` is added at ``score`` to each of ``indexes`` (sorted sets kept
    ``ttl_s`` too), whose members scored at or below ``trim_to`` are dropped (0: none
    this time)."""

    fields: Mapping[str, str]
    ttl_s: int
    indexes: tuple[str, ...] = ()
    member: str = ""
    score: int = 0
    trim_to: int = 0


@dataclass(frozen=True)
class LinkAdvance:
    """A compare-and-set on the link's hash made in the step that records the run linking
    to it: the run is recorded only if the hash still shows ``status`` (and ``turn``, ''
    for any), and ``fields`` are then written over it (a None value removes a field) and
    the hash kept ``ttl_s``. A caller that moves its record on and starts the run of the
    next stage does both in one round trip, and never leaves the record moved on without
    that run."""

    status: str
    turn: str
    fields: Mapping[str, Any]
    ttl_s: int


class LinkMoved(Conflict):
    """The link's hash was no longer where a `LinkAdvance` expected it: nothing recorded."""


@dataclass(frozen=True)
class Claim:
    """A successful claim: the attempt number guards every later write.

    ``run`` is the run as claimed; ``session`` (the session hash) and ``history`` (its
    last messages, oldest first) are read in the same step when asked for."""

    attempt: int
    deadline_at_ms: int
    exhausted: bool = False
    run: RunRecord | None = None
    session: dict[str, str] | None = None
    history: list[dict[str, Any]] | None = None
    # ``history`` as the process's windows hold it (`store.windows`), when the claim read it
    # through them: the same messages, each with a slot for its model form.
    entries: tuple[HistoryEntry, ...] | None = None
    # The claim step added the run.started event itself.
    started_published: bool = False
    # The run's first claim (its first try): the run starts now (counted: `Metrics`).
    first: bool = False


@dataclass(frozen=True)
class Started:
    """A recorded run: whether it took the lane (enqueue it), or the run an idempotency
    key already names (then nothing was recorded)."""

    took_lane: bool
    session_id: str
    session_created: bool
    existing_run_id: str | None = None
    # The run claimed in the same step (`start` with ``claim_history``), or why not.
    claim: Claim | str | None = None


@dataclass(frozen=True)
class FinishResult:
    """What ending a run set in motion: the next run of the lane, and parked waiters."""

    applied: bool
    next_run_id: str | None = None
    waiters: tuple[str, ...] = ()
    # The run as ended (read in the same step).
    run: RunRecord | None = None
    # Not ended: messages were steered into the turn meanwhile (transcript form, oldest
    # first); what it said so far is kept, and it goes on with them (finish_run.lua).
    steered: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class ParkedCall:
    """A deferred tool call a parked run waits on."""

    tool_call_id: str
    tool_name: str
    target_run_id: str
    deadline_ms: int
    context: Mapping[str, Any] = field(default_factory=dict)
    # More runs whose end may answer the call (any one of them, `WaitFor.also`).
    also_run_ids: tuple[str, ...] = ()

    @property
    def target_run_ids(self) -> tuple[str, ...]:
        """Every run whose end may answer the call."""
        return (self.target_run_id, *self.also_run_ids)

    def to_json(self) -> dict[str, Any]:
        """As stored in the run hash."""
        out = {
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "targetRunId": self.target_run_id,
            "deadlineMs": self.deadline_ms,
            "context": dict(self.context),
        }
        if self.also_run_ids:
            out["alsoRunIds"] = list(self.also_run_ids)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ParkedCall:
        """From the run hash."""
        return cls(
            tool_call_id=d["toolCallId"],
            tool_name=d["toolName"],
            target_run_id=d["targetRunId"],
            deadline_ms=int(d["deadlineMs"]),
            context=d.get("context") or {},
            also_run_ids=tuple(str(r) for r in d.get("alsoRunIds") or ()),
        )
