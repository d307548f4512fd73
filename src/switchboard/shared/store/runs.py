"""Run records and session lanes: submit, claim, park, resume and finish, atomically.

A run is one agent turn in one session. Only one run per session executes at a time
(the session lane); the others wait in the lane queue and start, in order, when the
holder ends. Every transition is one Lua script, so a crashed worker can never strand a
queued run or write a transcript twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from redis import Redis
from redis.client import Pipeline

from switchboard.shared import keys as sk
from switchboard.shared.errors import Conflict
from switchboard.shared.store import codec
from switchboard.shared.store.keyspace import EVENTS_MAXLEN, LANE_LEASE_S, Keyspace
from switchboard.shared.store.scripts import Scripts, as_text
from switchboard.shared.store.transcripts import decode_entries

RunStatus = Literal["queued", "running", "parked", "ok", "error", "timeout"]
TERMINAL: frozenset[str] = frozenset({"ok", "error", "timeout"})


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
    meta: dict[str, Any] = field(default_factory=dict)
    on_end: dict[str, Any] | None = None
    # Hashes the run's end step read for its follow-up step (Redis key -> decoded fields;
    # an absent hash is {}): the step takes them instead of reading them again.
    read_at_end: Mapping[str, Mapping[str, str]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def terminal(self) -> bool:
        """True once the run has an outcome."""
        return self.status in TERMINAL

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
            meta=codec.as_json(h.get("meta"), {}),
            on_end=codec.as_json(h.get("onEnd")),
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
    # (hash key, field): where the run's id is recorded as it is recorded, unless that
    # field is set already (a flow's ``run:<turn>`` or ``announceRunId``).
    link: tuple[str, str] | None = None
    # A new record at the link's hash, written in the same step as the run (a new flow).
    link_record: LinkRecord | None = None
    # A compare-and-set on the link's hash, made in the same step; the run is recorded only
    # if it holds (`LinkAdvance`).
    link_advance: LinkAdvance | None = None
    # Someone will wait for the run's end: it is published on the run-ended channel (an
    # unwatched run's end is published only if a waiter marks it first, `WATCH_RUN`).
    watched: bool = False


@dataclass(frozen=True)
class LinkRecord:
    """A record created in the step that records the run linking to it (a new flow and
    its first run: one round trip, not two). ``fields`` are text values; the hash is kept
    ``ttl_s``; ``member`` is added at ``score`` to each of ``indexes`` (sorted sets kept
    ``ttl_s`` too), whose members scored at or below ``trim_to`` are dropped."""

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
    the hash kept ``ttl_s``. A flow step that moves its flow on and starts the run of the
    next stage does both in one round trip, and never leaves the flow moved on without
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
    # The claim step added the run.started event itself.
    started_published: bool = False


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


@dataclass(frozen=True)
class ParkedCall:
    """A deferred tool call a parked run waits on."""

    tool_call_id: str
    tool_name: str
    target_run_id: str
    deadline_ms: int
    context: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """As stored in the run hash."""
        return {
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "targetRunId": self.target_run_id,
            "deadlineMs": self.deadline_ms,
            "context": dict(self.context),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ParkedCall:
        """From the run hash."""
        return cls(
            tool_call_id=d["toolCallId"],
            tool_name=d["toolName"],
            target_run_id=d["targetRunId"],
            deadline_ms=int(d["deadlineMs"]),
            context=d.get("context") or {},
        )


def _run_fields(run: NewRun, created_at_ms: int | None = None) -> dict[str, Any]:
    """The hash fields of a new queued run (a new hash: unset fields are left out)."""
    fields = {
        "sessionKey": run.session_key,
        "status": "queued",
        "createdAt": created_at_ms or now_ms(),
        "timeoutS": run.timeout_s,
        "attempt": 0,
        "kind": run.kind,
        "message": run.message,
        "extraSystemPrompt": run.extra_system_prompt,
        "model": run.model,
        "channel": run.channel,
        "meta": dict(run.meta) if run.meta else None,
        "onEnd": dict(run.on_end) if run.on_end else None,
        "watch": "1" if run.watched else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _link_advance_args(adv: LinkAdvance) -> tuple[str, str, str, int]:
    """A `LinkAdvance` as LUA_LINK_ADVANCE takes it."""
    return adv.status, adv.turn, codec.fields_json(adv.fields), adv.ttl_s


def _claim_of(run_id: str, res: Any) -> Claim | str:
    """A claim script's answer (CLAIM_RUN, or START_RUN's fifth element) as a `Claim`, or
    the reason string when the run must not run."""
    verdict = as_text(res[0])
    if verdict == "exhausted":
        return Claim(
            attempt=int(as_text(res[1])),
            deadline_at_ms=0,
            exhausted=True,
            run=RunRecord.from_hash(run_id, codec.decode_flat_hash(res[3])),
        )
    if verdict != "ok":
        return f"{verdict}:{as_text(res[1])}"
    return Claim(
        attempt=int(as_text(res[1])),
        deadline_at_ms=int(float(as_text(res[2]))),
        run=RunRecord.from_hash(run_id, codec.decode_flat_hash(res[3])),
        session=codec.decode_flat_hash(res[4]),
        history=decode_entries(res[5], newest_first=True) if len(res) > 5 else [],
        started_published=True,
    )


class RunStore:
    """Run records, lanes, parking and wake-ups in Redis."""

    def __init__(
        self,
        redis: Redis,
        ks: Keyspace,
        *,
        retention_s: int,
        max_attempts: int,
        kind_of: Callable[[str], str],
        lease_s: int = LANE_LEASE_S,
    ) -> None:
        self.lease_s = lease_s
        self.redis = redis
        self.ks = ks
        self._kind_of = kind_of
        self.scripts = Scripts(redis)
        self.retention_s = retention_s
        self.max_attempts = max_attempts

    # -- reading ----------------------------------------------------------------------
    def get(self, run_id: str) -> RunRecord | None:
        """The run, or None when unknown or expired."""
        raw = self.redis.hgetall(self.ks.run(run_id))
        if not raw:
            return None
        return RunRecord.from_hash(run_id, codec.decode_hash(raw))

    def get_many(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        """Several runs in one round trip (none for none)."""
        if not run_ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for rid in run_ids:
            pipe.hgetall(self.ks.run(rid))
        out: list[RunRecord | None] = []
        for rid, raw in zip(run_ids, pipe.execute(), strict=True):
            out.append(RunRecord.from_hash(rid, codec.decode_hash(raw)) if raw else None)
        return out

    def lane_holder(self, session_key: str) -> str | None:
        """The run holding a session's lane."""
        raw = self.redis.get(self.ks.lane(session_key))
        return as_text(raw) or None

    def lane_queue(self, session_key: str) -> list[str]:
        """Runs waiting for a session's lane, oldest first."""
        return [as_text(v) for v in self.redis.lrange(self.ks.lane_queue(session_key), 0, -1)]

    # -- idempotency ------------------------------------------------------------------
    def remember_idempotency(self, session_key: str, idem_key: str, run_id: str) -> str:
        """Map an idempotency key to a run; returns the run already mapped, if any."""
        from switchboard.shared.store.keyspace import IDEMPOTENCY_TTL_S

        k = self.ks.idempotency(session_key, idem_key)
        if self.redis.set(k, run_id, nx=True, ex=IDEMPOTENCY_TTL_S):
            return run_id
        return as_text(self.redis.get(k)) or run_id

    # -- transitions ------------------------------------------------------------------
    def submit(self, run: NewRun) -> bool:
        """Record a new queued run; True when it took the lane and should be enqueued."""
        lease = now_ms() + self.lease_s * 1000
        took = self.scripts.submit_run(
            keys=[
                self.ks.run(run.run_id),
                self.ks.lane(run.session_key),
                self.ks.lane_queue(run.session_key),
                self.ks.lane_leases,
            ],
            args=[run.run_id, run.session_key, lease, codec.fields_json(_run_fields(run))],
        )
        return bool(int(took))

    def start(
        self,
        run: NewRun,
        *,
        on_create: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        claim_history: int | None = None,
    ) -> Started:
        """Create the session entry if missing and touch it, then record the run (unless
        ``idempotency_key`` already names a run), in one step. With ``claim_history``, a
        run that took its lane is claimed in that step too (as `claim` with that
        ``history``), for the caller to execute at once."""
        res = self._start(run, on_create, idempotency_key, now_ms(), self.redis, claim_history)
        if as_text(res[0]) == "moved":
            raise LinkMoved(f"{as_text(run.link[0]) if run.link else 'link'} has moved on")
        verdict = as_text(res[2])
        return Started(
            took_lane=verdict == "lane",
            session_id=as_text(res[1]),
            session_created=bool(int(res[0])),
            existing_run_id=as_text(res[3]) if verdict == "duplicate" else None,
            claim=_claim_of(run.run_id, res[4]) if len(res) > 4 else None,
        )

    def advance_link(self, key: str, adv: LinkAdvance) -> None:
        """Make a `LinkAdvance` on hash ``key`` on its own (not with a run's start); raise
        `LinkMoved` if the hash has moved on."""
        if not int(self.scripts.advance_link(keys=[key], args=_link_advance_args(adv))):
            raise LinkMoved(f"{key} has moved on")

    def write_link_record(self, key: str, rec: LinkRecord) -> None:
        """Write a link record at hash ``key`` on its own (not with a run's start)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping=dict(rec.fields))  # type: ignore[arg-type]
        pipe.expire(key, rec.ttl_s)
        for index in rec.indexes:
            pipe.zadd(index, {rec.member: rec.score})
            pipe.zremrangebyscore(index, "-inf", rec.trim_to)
            pipe.expire(index, rec.ttl_s)
        pipe.execute()

    def start_in(
        self, pipe: Pipeline, run: NewRun, *, on_create: Mapping[str, Any], now: int
    ) -> None:
        """Queue `start` (no idempotency key) in ``pipe``; its reply there is
        ``[created, sessionId, 'lane' | 'queued', '']``."""
        self._start(run, on_create, None, now, pipe)

    def _start(
        self,
        run: NewRun,
        on_create: Mapping[str, Any] | None,
        idempotency_key: str | None,
        now: int,
        client: Redis | Pipeline,
        claim_history: int | None = None,
    ) -> Any:
        from switchboard.shared.store.keyspace import IDEMPOTENCY_TTL_S

        key = run.session_key
        agent_id = sk.agent_id_of(key)
        idem = self.ks.idempotency(key, idempotency_key) if idempotency_key else ""
        rec = run.link_record if run.link else None
        return self.scripts.start_run(
            keys=[
                self.ks.session(key),
                self.ks.session_ids,
                self.ks.updated_all,
                self.ks.updated_agent(agent_id),
                self.ks.updated_kind(agent_id, self._kind_of(key)),
                self.ks.run(run.run_id),
                self.ks.lane(key),
                self.ks.lane_queue(key),
                self.ks.lane_leases,
                idem or self.ks.run(run.run_id),
                run.link[0] if run.link else self.ks.run(run.run_id),
                self.ks.active_runs,
                self.ks.transcript(key),
                self.ks.metrics,
                self.ks.events,
                *(rec.indexes if rec else ()),
            ],
            args=[
                key,
                now,
                sk.new_session_id(),
                codec.fields_json(on_create or {}),
                run.run_id,
                now + self.lease_s * 1000,
                codec.fields_json(_run_fields(run, now)),
                IDEMPOTENCY_TTL_S if idem else "",
                run.link[1] if run.link else "",
                codec.fields_json(rec.fields) if rec else "",
                rec.ttl_s if rec else "",
                rec.score if rec else "",
                rec.member if rec else "",
                rec.trim_to if rec else "",
                "" if claim_history is None else claim_history,
                self.max_attempts,
                600_000,
                EVENTS_MAXLEN,
                *(_link_advance_args(run.link_advance) if run.link_advance else ("",) * 4),
            ],
            client=client,
        )

    def claim(self, run_id: str, session_key: str, *, history: int = 0) -> Claim | str:
        """Start a queued run that holds its lane; a reason string when it must not run.

        The claim carries the run, its session hash and the last ``history`` messages.
        ``session_key`` is the one the run was enqueued with; a run recorded under another
        key is claimed under that one."""
        res = self._claim(run_id, session_key, history)
        if as_text(res[0]) == "session":
            res = self._claim(run_id, as_text(res[1]), history)
        return _claim_of(run_id, res)

    def _claim(self, run_id: str, session_key: str, history: int) -> Any:
        # KEYS and ARGV as `LUA_CLAIM` takes them; `_start` passes the same to its claim.
        agent_id = sk.agent_id_of(session_key)
        kind = self._kind_of(session_key)
        now = now_ms()
        return self.scripts.claim_run(
            keys=[
                self.ks.run(run_id),
                self.ks.lane(session_key),
                self.ks.lane_leases,
                self.ks.active_runs,
                self.ks.session(session_key),
                self.ks.transcript(session_key),
                self.ks.updated_all,
                self.ks.updated_agent(agent_id),
                self.ks.updated_kind(agent_id, kind),
                self.ks.metrics,
                self.ks.events,
            ],
            args=[
                run_id,
                session_key,
                now,
                now + self.lease_s * 1000,
                "queued",
                self.max_attempts,
                600_000,
                history,
                EVENTS_MAXLEN,
            ],
        )

    def resume(self, run_id: str, session_key: str, *, history: int = 0) -> Claim | str:
        """Move a parked run back to running (one resume wins); the claim carries the
        session hash and the last ``history`` messages."""
        res = self.scripts.resume_run(
            keys=[
                self.ks.run(run_id),
                self.ks.parked_runs,
                self.ks.lane_leases,
                self.ks.session(session_key),
                self.ks.transcript(session_key),
            ],
            args=[run_id, session_key, now_ms() + self.lease_s * 1000, self.max_attempts, history],
        )
        verdict = as_text(res[0])
        if verdict not in ("ok", "exhausted"):
            return f"{verdict}:{as_text(res[1])}"
        return Claim(
            attempt=int(as_text(res[1])),
            deadline_at_ms=int(float(as_text(res[2]) or 0)),
            exhausted=verdict == "exhausted",
            session=codec.decode_flat_hash(res[3]) if len(res) > 3 else None,
            history=decode_entries(res[4], newest_first=True) if len(res) > 4 else [],
        )

    def renew_lease(self, session_key: str) -> None:
        """Push a held lane's lease forward (the running worker is alive)."""
        self.renew_leases([session_key])

    def renew_leases(self, session_keys: Sequence[str]) -> None:
        """Push the leases of held lanes forward, in one write (lanes no longer leased
        stay so)."""
        if session_keys:
            until = now_ms() + self.lease_s * 1000
            self.redis.zadd(self.ks.lane_leases, dict.fromkeys(session_keys, until), xx=True)

    def finish(
        self,
        run_id: str,
        session_key: str,
        attempt: int,
        *,
        status: str,
        messages: Sequence[Mapping[str, Any]] = (),
        reply: str | None = None,
        error: str | None = None,
        usage: Mapping[str, Any] | None = None,
        session_fields: Mapping[str, Any] | None = None,
        session_incr: Mapping[str, int] | None = None,
        event: tuple[str, Mapping[str, Any], int] | None = None,
        follow_up_reads: str | None = None,
    ) -> FinishResult:
        """End a run: append messages, store the outcome, hand the lane on, wake waiters.

        ``event`` (type, data, stream cap) goes to the events stream if the end applies.
        ``follow_up_reads`` names the hash the run's follow-up step reads first: it and the
        session hash are read in the same step (`RunRecord.read_at_end`)."""
        agent_id = sk.agent_id_of(session_key)
        run_fields = {
            "status": status,
            "reply": reply,
            "error": error,
            "usage": dict(usage) if usage else None,
            "parked": None,
        }
        sfields = {"status": status, **(session_fields or {})}
        res = self.scripts.finish_run(
            keys=[
                self.ks.run(run_id),
                self.ks.lane(session_key),
                self.ks.lane_queue(session_key),
                self.ks.lane_leases,
                self.ks.active_runs,
                self.ks.session(session_key),
                self.ks.transcript(session_key),
                self.ks.updated_all,
                self.ks.updated_agent(agent_id),
                self.ks.updated_kind(agent_id, self._kind_of(session_key)),
                self.ks.run_waiters(run_id),
                self.ks.outbox,
                self.ks.metrics,
                self.ks.events,
                follow_up_reads or self.ks.run(run_id),
            ],
            args=[
                run_id,
                session_key,
                now_ms(),
                attempt,
                codec.fields_json(run_fields),
                codec.fields_json(sfields),
                codec.dumps(dict(session_incr)) if session_incr else "",
                self.retention_s,
                now_ms() + self.lease_s * 1000,
                self.ks.run_events,
                *((event[0], codec.dumps(event[1]), event[2]) if event else ("", "", 0)),
                "1" if follow_up_reads else "",
                *[codec.dumps(m) for m in messages],
            ],
        )
        if as_text(res[0]) != "ok":
            return FinishResult(applied=False)
        run = RunRecord.from_hash(run_id, codec.decode_flat_hash(res[2]))
        if follow_up_reads:
            run.read_at_end = {
                self.ks.session(session_key): codec.decode_flat_hash(res[3]),
                follow_up_reads: codec.decode_flat_hash(res[4]),
            }
        return FinishResult(
            applied=True,
            next_run_id=as_text(res[1]) or None,
            waiters=tuple(as_text(w) for w in res[5:]),
            run=run,
        )

    def park(
        self,
        run_id: str,
        session_key: str,
        attempt: int,
        *,
        calls: Sequence[ParkedCall],
        messages: Sequence[Mapping[str, Any]],
    ) -> str:
        """Park a run on deferred calls: 'parked', 'ready' (all targets ended) or 'stale'."""
        agent_id = sk.agent_id_of(session_key)
        deadline = max(c.deadline_ms for c in calls)
        keys = [
            self.ks.run(run_id),
            self.ks.session(session_key),
            self.ks.transcript(session_key),
            self.ks.parked_runs,
            self.ks.lane_leases,
            self.ks.updated_all,
            self.ks.updated_agent(agent_id),
            self.ks.updated_kind(agent_id, self._kind_of(session_key)),
        ]
        for c in calls:
            keys += [self.ks.run(c.target_run_id), self.ks.run_waiters(c.target_run_id)]
        res = self.scripts.park_run(
            keys=keys,
            args=[
                run_id,
                session_key,
                now_ms(),
                attempt,
                codec.dumps([c.to_json() for c in calls]),
                deadline,
                deadline + self.lease_s * 1000,
                len(messages),
                *[codec.dumps(m) for m in messages],
            ],
        )
        return as_text(res)

    def release_lane(self, session_key: str, holder: str) -> str | None:
        """Hand a lane whose holder ended or vanished to the next queued run."""
        nxt = self.scripts.release_lane(
            keys=[
                self.ks.lane(session_key),
                self.ks.lane_queue(session_key),
                self.ks.lane_leases,
            ],
            args=[holder, session_key, now_ms() + self.lease_s * 1000],
        )
        return as_text(nxt) or None

    def expired_leases(self, now: int, limit: int = 500) -> list[str]:
        """Session keys whose lane lease has expired."""
        rows = self.redis.zrangebyscore(self.ks.lane_leases, "-inf", now, start=0, num=limit)
        return [as_text(r) for r in rows]

    def overdue_parked(self, now: int, limit: int = 500) -> list[str]:
        """Parked runs whose wait deadline has passed."""
        rows = self.redis.zrangebyscore(self.ks.parked_runs, "-inf", now, start=0, num=limit)
        return [as_text(r) for r in rows]

    def push_lease(self, session_key: str, until_ms: int) -> None:
        """Set a lane lease expiry."""
        self.redis.zadd(self.ks.lane_leases, {session_key: until_ms})

    def push_parked(self, run_id: str, until_ms: int) -> None:
        """Postpone the next overdue check of a parked run."""
        self.redis.zadd(self.ks.parked_runs, {run_id: until_ms}, xx=True)

    def outbox_due(self, before_ms: int, limit: int = 500) -> list[str]:
        """Ended runs whose follow-up was recorded before ``before_ms`` and not confirmed."""
        rows = self.redis.zrangebyscore(self.ks.outbox, "-inf", before_ms, start=0, num=limit)
        return [as_text(r) for r in rows]

    def outbox_done(self, *run_ids: str) -> None:
        """These runs' follow-ups are enqueued (or have run)."""
        self.redis.zrem(self.ks.outbox, *run_ids)

    def outbox_retry_later(self, run_id: str, at_ms: int) -> None:
        """Look at an outbox entry again at ``at_ms``."""
        self.redis.zadd(self.ks.outbox, {run_id: at_ms}, xx=True)

    def requeue(self, run_id: str, attempt: int | None = None) -> str:
        """Mark a running run whose worker vanished as queued again."""
        res = self.scripts.requeue_run(
            keys=[self.ks.run(run_id)], args=["" if attempt is None else attempt]
        )
        return as_text(res)

    def set_meta(self, run_id: str, **fields: Any) -> None:
        """Set extra fields on a run hash."""
        enc: dict[str | bytes, str] = {
            k: v for k, v in ((k, codec.encode_value(v)) for k, v in fields.items()) if v
        }
        if enc:
            self.redis.hset(self.ks.run(run_id), mapping=enc)  # type: ignore[arg-type]
