"""Run records and session lanes: submit, claim, park, resume and finish, atomically.

A run is one agent turn in one session. Only one run per session executes at a time
(the session lane); the others wait in the lane queue and start, in order, when the
holder ends. Every transition is one Lua script, so a crashed worker can never strand a
queued run or write a transcript twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from redis import Redis
from redis.client import Pipeline

from switchboard import telemetry
from switchboard.shared import keys as sk
from switchboard.shared.errors import StoreUnavailable
from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.due_index import members_due
from switchboard.shared.store.keyspace import (
    EVENTS_MAXLEN,
    IDEMPOTENCY_TTL_S,
    LANE_LEASE_S,
    Keyspace,
)
from switchboard.shared.store.lua_scripts import LuaScripts
from switchboard.shared.store.redis_errors import unavailable
from switchboard.shared.store.run_records import (
    TERMINAL,
    Claim,
    FinishResult,
    LinkAdvance,
    LinkMoved,
    LinkRecord,
    NewRun,
    ParkedCall,
    RunRecord,
    RunStatus,
    Started,
    now_ms,
)
from switchboard.shared.store.transcripts import decode_entries
from switchboard.shared.store.windows import HistoryEntry, TranscriptWindows, Window

log = logging.getLogger("switchboard.store")

# The records live in run_records; importing them from here keeps callers' imports short.
__all__ = [
    "TERMINAL",
    "Claim",
    "FinishResult",
    "LinkAdvance",
    "LinkMoved",
    "LinkRecord",
    "NewRun",
    "ParkedCall",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "Started",
    "now_ms",
]


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
        "attachments": list(run.attachments) or None,
        "clientTools": [dict(t) for t in run.client_tools] or None,
        # JSON even when a plain string ("required"): read back with `codec.as_json`.
        "toolChoice": codec.dumps(run.tool_choice) if run.tool_choice is not None else None,
        "toolResults": [dict(t) for t in run.tool_results] or None,
        "traceparent": telemetry.traceparent(),  # None unless tracing is on
    }
    return {k: v for k, v in fields.items() if v is not None}


# A run's default timeout when it has none of its own (the claim sets its deadline).
_DEFAULT_TIMEOUT_MS = 600_000


def _advance_args(adv: LinkAdvance | None) -> dict[str, Any]:
    """A `LinkAdvance` as start_run.lua's ``advance_*`` arguments ('' status: none)."""
    if adv is None:
        return {"advance_status": "", "advance_turn": "", "advance_fields": "", "advance_ttl_s": ""}
    return {
        "advance_status": adv.status,
        "advance_turn": adv.turn,
        "advance_fields": codec.fields_json(adv.fields),
        "advance_ttl_s": adv.ttl_s,
    }


def _record_arg(rec: LinkRecord | None) -> str:
    """A `LinkRecord` as start_run.lua's ``record`` argument ('' = none)."""
    if rec is None:
        return ""
    return codec.dumps(
        {
            "fields": codec.text_fields(rec.fields),
            "ttl_s": rec.ttl_s,
            "member": rec.member,
            "score": rec.score,
            "trim_to": rec.trim_to,
        }
    )


@dataclass(frozen=True)
class _HistoryRead:
    """A claim's history read through the process's windows (`store.windows`): the
    window it starts from (None: read whole) and where the answer is merged."""

    windows: TranscriptWindows
    key: str
    limit: int
    base: Window | None

    def args(self) -> dict[str, str | int]:
        """start_run's claim ``after_sid``/``after_seq``: the window the claim may continue."""
        if self.base is None:
            return {"after_sid": "", "after_seq": 0}
        return {"after_sid": self.base.session_id, "after_seq": self.base.seq}

    def entries(self, session: Mapping[str, str], res: Any) -> tuple[HistoryEntry, ...]:
        """The claim's last ``limit`` messages, its answer merged with the window."""
        rows = [
            HistoryEntry(int(m["__openclaw"]["seq"]), m, _stored_bytes(row))
            for row in reversed(res[5])
            for m in decode_entries([row])
        ]
        after = int(as_text(res[6])) if len(res) > 6 else None
        session_id = str(session.get("sessionId") or "")
        return self.windows.merge(
            self.key, session_id, rows, base=self.base, after=after, limit=self.limit
        )


def _stored_bytes(row: Any) -> int:
    """The length of a transcript entry's stored JSON (``[id, [b"m", json]]``)."""
    fields = row[1]
    values = fields.values() if isinstance(fields, Mapping) else fields[1::2]
    return sum(len(v) for v in values if isinstance(v, bytes | str))


def _claim_of(run_id: str, res: Any, read: _HistoryRead | None = None) -> Claim | str:
    """A claim's answer (claim_run.lua, or start_run.lua's fifth element) as a `Claim`, or
    the reason string when the run must not run (``read``: its history went through the
    process's windows)."""
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
    session = codec.decode_flat_hash(res[4])
    run = codec.decode_flat_hash(res[3])
    entries = read.entries(session, res) if read is not None and len(res) > 5 else None
    if entries is not None:
        history = [e.message for e in entries]
    else:
        history = decode_entries(res[5], newest_first=True) if len(res) > 5 else []
    return Claim(
        attempt=int(as_text(res[1])),
        deadline_at_ms=int(float(as_text(res[2]))),
        run=RunRecord.from_hash(run_id, run),
        session=session,
        history=history,
        entries=entries,
        started_published=True,
        first=run.get("tries") == "1",
    )


# A cancel request for a running run is looked for this long (its worker checks within a
# second; a worker that died meanwhile leaves the stamp on the run hash for the next claim).
CANCEL_REQUEST_TTL_MS = 600_000


@dataclass(frozen=True)
class CancelResult:
    """What `RunStore.cancel` did: ``verdict`` 'cancelled' (ended here: the lane's next
    run, the waiters to resume and the run as ended are given), 'requested' (the running
    worker stops it), 'ended' (it had ended already: ``status``) or 'missing'."""

    verdict: str
    status: str = ""
    next_run_id: str | None = None
    run: RunRecord | None = None
    waiters: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunEnd:
    """How a run ends (`RunStore.finish`): its status, the messages it appends, its
    outcome and usage, the session's fields and counters to set, the ``event`` (type,
    data, stream cap) for the events stream if the end applies, the hash its follow-up
    step reads first (``follow_up_reads``: it and the session hash are read in the same
    step, `RunRecord.read_at_end`), more fields for the run (``run_fields``:
    ``yielded``) and how many messages of its session's steer inbox it took
    (``steer_taken``: they are among its messages)."""

    status: str
    messages: Sequence[Mapping[str, Any]] = ()
    reply: str | None = None
    error: str | None = None
    usage: Mapping[str, Any] | None = None
    session_fields: Mapping[str, Any] | None = None
    session_incr: Mapping[str, int] | None = None
    event: tuple[str, Mapping[str, Any], int] | None = None
    follow_up_reads: str | None = None
    run_fields: Mapping[str, Any] | None = None
    steer_taken: int = 0


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
        windows: TranscriptWindows | None = None,
        publish_ends_after_wait: bool = False,
    ) -> None:
        self.lease_s = lease_s
        # With acknowledged writes (WAIT for replicas), a run's end is published once its
        # WAIT has answered, not from inside its script: a waiter is not told of an end
        # that a failover could still lose (`finish`).
        self.publish_ends_after_wait = publish_ends_after_wait
        # The process's copies of recent history, when claims read it incrementally.
        self.windows = windows
        self.redis = redis
        self.ks = ks
        self._kind_of = kind_of
        self._lua = LuaScripts(redis)
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

    def status(self, run_id: str) -> str:
        """A run's status alone ("" when unknown or expired)."""
        return as_text(self.redis.hget(self.ks.run(run_id), "status"))

    def lane_holder(self, session_key: str) -> str | None:
        """The run holding a session's lane."""
        raw = self.redis.get(self.ks.lane(session_key))
        return as_text(raw) or None

    def lane_queue(self, session_key: str) -> list[str]:
        """Runs waiting for a session's lane, oldest first."""
        return [as_text(v) for v in self.redis.lrange(self.ks.lane_queue(session_key), 0, -1)]

    def lane_state(self, session_key: str) -> tuple[str | None, int]:
        """A session's lane in one round trip: the run holding it (None when free) and
        how many runs are queued behind it."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(self.ks.lane(session_key))
        pipe.llen(self.ks.lane_queue(session_key))
        holder, queued = pipe.execute()
        return as_text(holder) or None, int(queued)

    # -- idempotency ------------------------------------------------------------------
    def remember_idempotency(self, session_key: str, idem_key: str, run_id: str) -> str:
        """Map an idempotency key to a run; returns the run already mapped, if any."""
        k = self.ks.idempotency(session_key, idem_key)
        if self.redis.set(k, run_id, nx=True, ex=IDEMPOTENCY_TTL_S):
            return run_id
        return as_text(self.redis.get(k)) or run_id

    # -- transitions ------------------------------------------------------------------
    def submit(self, run: NewRun) -> bool:
        """Record a new queued run; True when it took the lane and should be enqueued."""
        lease = now_ms() + self.lease_s * 1000
        took = self._lua["submit_run"](
            run=self.ks.run(run.run_id),
            lane=self.ks.lane(run.session_key),
            lane_queue=self.ks.lane_queue(run.session_key),
            leases=self.ks.beside(run.session_key).lane_leases,
            run_id=run.run_id,
            session_key=run.session_key,
            lease_at_ms=lease,
            run_fields=codec.fields_json(_run_fields(run)),
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
        read = self._history_read(run.session_key, claim_history)
        link = run.link
        if link is not None and self.ks.group_of(link[0]) != self.ks.group_of_key(run.session_key):
            run = self._link_apart(run)  # the link's slot is another: its writes go first
        res = self._start(
            run, on_create, idempotency_key, now_ms(), self.redis, claim_history, read
        )
        if as_text(res[0]) == "moved":
            raise LinkMoved(f"{as_text(run.link[0]) if run.link else 'link'} has moved on")
        verdict = as_text(res[2])
        if link is not None and run.link is None:  # named once the run is recorded
            self.name_link(link, as_text(res[3]) if verdict == "duplicate" else run.run_id)
        return Started(
            took_lane=verdict == "lane",
            session_id=as_text(res[1]),
            session_created=bool(int(res[0])),
            existing_run_id=as_text(res[3]) if verdict == "duplicate" else None,
            claim=_claim_of(run.run_id, res[4], read) if len(res) > 4 else None,
        )

    def _link_apart(self, run: NewRun) -> NewRun:
        """A run whose link is in another slot group than its session: the link's
        compare-and-set and record are made first, each in its own step (raising
        `LinkMoved` when the link has moved on), and the run goes without them; the
        caller names the run in the link once it is recorded. A crash between the steps
        leaves the link moved on (or recorded) without its run: a caller's retry finds
        it so, as after a crash right after the run's start (the flow steps restart a
        round whose run is not named: `reply_back._rekick`)."""
        assert run.link is not None
        if run.link_advance is not None:
            self.advance_link(run.link[0], run.link_advance)
        if run.link_record is not None:
            self.write_link_record(run.link[0], run.link_record)
        return replace(run, link=None, link_record=None, link_advance=None)

    def advance_link(self, key: str, adv: LinkAdvance) -> None:
        """Make a `LinkAdvance` on hash ``key`` on its own (not with a run's start); raise
        `LinkMoved` if the hash has moved on."""
        made = self._lua["advance_link"](
            link=key,
            status=adv.status,
            turn=adv.turn,
            fields=codec.fields_json(adv.fields),
            ttl_s=adv.ttl_s,
        )
        if not int(made):
            raise LinkMoved(f"{key} has moved on")

    def write_link_record(self, key: str, rec: LinkRecord) -> None:
        """Write a link record at hash ``key`` on its own (not with a run's start), then
        add it to its indexes (each in its own session's slot group)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(key, mapping=dict(rec.fields))  # type: ignore[arg-type]
        pipe.expire(key, rec.ttl_s)
        self._index_record(pipe, rec, rec.indexes)
        pipe.execute()

    @staticmethod
    def _index_record(pipe: Pipeline, rec: LinkRecord, indexes: Sequence[str]) -> None:
        """Queue the record's member on ``indexes``, trimmed and kept as the record."""
        for index in indexes:
            pipe.zadd(index, {rec.member: rec.score})
            if rec.trim_to:
                pipe.zremrangebyscore(index, "-inf", rec.trim_to)
            pipe.expire(index, rec.ttl_s)

    def name_link(self, link: tuple[str, str], run_id: str) -> None:
        """Name ``run_id`` at the link's (hash, field) unless a run is named there already."""
        self.redis.hsetnx(link[0], link[1], run_id)

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
        read: _HistoryRead | None = None,
    ) -> Any:
        key = run.session_key
        group = self.ks.beside(key)
        own = self.ks.run(run.run_id)  # stands in for an idempotency key or link not given
        rec = run.link_record if run.link else None
        indexes = rec.indexes if rec else ()
        if rec is not None:  # indexes of another slot group (a requester's) go first
            apart = [i for i in indexes if self.ks.group_of(i) != group.group]
            if apart:
                early = self.redis.pipeline(transaction=False)
                self._index_record(early, rec, apart)
                early.execute()
                indexes = tuple(i for i in indexes if i not in apart)
        return self._lua["start_run"](
            client=client,
            **self._session_keys(key),
            run=own,
            lane=self.ks.lane(key),
            lane_queue=self.ks.lane_queue(key),
            leases=group.lane_leases,
            idempotency=self.ks.idempotency(key, idempotency_key) if idempotency_key else own,
            link=run.link[0] if run.link else own,
            transcript=self.ks.transcript(key),
            events=group.events,
            notices=self.ks.notices(key),
            record_indexes=indexes,
            session_key=key,
            now=now,
            session_id=self.ks.new_id(group.group),
            on_create=codec.fields_json(on_create or {}),
            run_id=run.run_id,
            lease_at_ms=now + self.lease_s * 1000,
            run_fields=codec.fields_json(_run_fields(run, now)),
            idem_ttl_s=IDEMPOTENCY_TTL_S if idempotency_key else "",
            link_field=run.link[1] if run.link else "",
            record=_record_arg(rec),
            claim=self._claim_arg(claim_history, read),
            **_advance_args(run.link_advance),
        )

    def _session_keys(self, key: str) -> dict[str, str]:
        """A session's hash, the sessionId index and its three updatedAt indexes, as the
        scripts name them."""
        agent_id = sk.agent_id_of(key)
        group = self.ks.beside(key)
        return {
            "session": self.ks.session(key),
            "sid_index": group.session_ids,
            "idx_all": group.updated_all,
            "idx_agent": group.updated_agent(agent_id),
            "idx_kind": group.updated_kind(agent_id, self._kind_of(key)),
        }

    def _lane_keys(self, run_id: str, session_key: str) -> dict[str, Any]:
        """The keys a run's end touches on its session's side, as finish_run.lua names
        them: the run, its session's lane, hash, transcript and updatedAt indexes, and the
        lease set."""
        keys = self._session_keys(session_key)
        del keys["sid_index"]
        group = self.ks.beside(session_key)
        return {
            **keys,
            "run": self.ks.run(run_id),
            "lane": self.ks.lane(session_key),
            "leases": group.lane_leases,
            "transcript": self.ks.transcript(session_key),
        }

    def _claim_arg(self, history: int | None, read: _HistoryRead | None = None) -> str:
        """start_run.lua's ``claim`` argument: claim with this history ('' = no claim)."""
        if history is None:
            return ""
        return codec.dumps(
            {
                "history": history,
                "max_attempts": self.max_attempts,
                "timeout_ms": _DEFAULT_TIMEOUT_MS,
                "events_cap": EVENTS_MAXLEN,
                **(read.args() if read is not None else {}),
            }
        )

    def _history_read(self, key: str, history: int | None) -> _HistoryRead | None:
        """How a claim of ``history`` messages of ``key`` reads them: through the
        process's windows when it keeps them (None: the last ``history``, whole)."""
        if self.windows is None or not history:
            return None
        return _HistoryRead(self.windows, key, history, self.windows.base(key, history))

    def claim(self, run_id: str, session_key: str, *, history: int = 0) -> Claim | str:
        """Start a queued run that holds its lane; a reason string when it must not run.

        The claim carries the run, its session hash and the last ``history`` messages.
        ``session_key`` is the one the run was enqueued with; a run recorded under another
        key is claimed under that one."""
        if self.ks.group_of_id(run_id) != self.ks.group_of_key(session_key):
            # Not the run's session (its id is made in its session's slot group): the
            # claim step may touch one slot only, so the run names its session first.
            recorded = as_text(self.redis.hget(self.ks.run(run_id), "sessionKey"))
            if not recorded:
                return "missing:"
            session_key = recorded
        read = self._history_read(session_key, history)
        res = self._claim(run_id, session_key, history, read)
        if as_text(res[0]) == "session":
            read = self._history_read(as_text(res[1]), history)
            res = self._claim(run_id, as_text(res[1]), history, read)
        return _claim_of(run_id, res, read)

    def _claim(
        self,
        run_id: str,
        session_key: str,
        history: int,
        read: _HistoryRead | None,
        client: Redis | None = None,
    ) -> Any:
        now = now_ms()
        return self._lua["claim_run"](
            client=client,
            run=self.ks.run(run_id),
            lane=self.ks.lane(session_key),
            leases=self.ks.beside(session_key).lane_leases,
            session=self.ks.session(session_key),
            transcript=self.ks.transcript(session_key),
            events=self.ks.beside(session_key).events,
            notices=self.ks.notices(session_key),
            run_id=run_id,
            session_key=session_key,
            now=now,
            lease_at_ms=now + self.lease_s * 1000,
            expect="queued",
            max_attempts=self.max_attempts,
            timeout_ms=_DEFAULT_TIMEOUT_MS,
            history=history,
            events_cap=EVENTS_MAXLEN,
            after_sid=read.base.session_id if read is not None and read.base else "",
            after_seq=read.base.seq if read is not None and read.base else 0,
        )

    def resume(self, run_id: str, session_key: str, *, history: int = 0) -> Claim | str:
        """Move a parked run back to running (one resume wins; no new try: see
        resume_run.lua); the claim carries the session hash and the last ``history``
        messages."""
        group = self.ks.beside(session_key)
        res = self._lua["resume_run"](
            run=self.ks.run(run_id),
            parked=group.parked_runs,
            leases=group.lane_leases,
            session=self.ks.session(session_key),
            transcript=self.ks.transcript(session_key),
            run_id=run_id,
            session_key=session_key,
            lease_at_ms=now_ms() + self.lease_s * 1000,
            max_attempts=self.max_attempts,
            history=history,
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
        if not session_keys:
            return
        until = now_ms() + self.lease_s * 1000
        by_group: dict[str, dict[str, int]] = {}
        for key in session_keys:
            by_group.setdefault(self.ks.beside(key).lane_leases, {})[key] = until
        pipe = self.redis.pipeline(transaction=False)
        for leases, members in by_group.items():
            pipe.zadd(leases, members, xx=True)
        pipe.execute()

    def is_current(self, run_id: str, attempt: int) -> bool:
        """The run is running at this attempt (no other attempt has taken it over)."""
        status, current = self.redis.hmget(self.ks.run(run_id), ["status", "attempt"])
        return as_text(status) == "running" and as_text(current) == str(attempt)

    def renew_held(self, held: Sequence[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
        """Push forward the leases of the lanes these runs hold, each given as (session
        key, run id, attempt), in one step (renew_held.lua): a lease is renewed only while
        its run holds the lane, runs, and is at that attempt. Answers the entries refused
        (their run was taken over, ended or parked: the caller's copy is stale)."""
        if not held:
            return []
        by_group: dict[int, list[int]] = {}  # positions in `held`, per slot group
        for at, (session_key, _, _) in enumerate(held):
            by_group.setdefault(self.ks.group_of_key(session_key), []).append(at)
        until = now_ms() + self.lease_s * 1000
        pipe = self.redis.pipeline(transaction=False)
        for group, positions in by_group.items():
            keys: list[str] = []
            entries: list[str | int] = []
            for at in positions:
                session_key, run_id, attempt = held[at]
                keys += [self.ks.lane(session_key), self.ks.run(run_id)]
                entries += [session_key, run_id, attempt]
            self._lua["renew_held"](
                client=pipe,
                leases=self.ks.at(group).lane_leases,
                held=keys,
                until_ms=until,
                entries=entries,
            )
        refused = []
        for positions, answer in zip(by_group.values(), pipe.execute(), strict=True):
            refused += [held[positions[int(i) - 1]] for i in answer]
        return refused

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
        run_fields: Mapping[str, Any] | None = None,
    ) -> FinishResult:
        """End a run: append messages, store the outcome, hand the lane on, wake waiters
        (the fields as `RunEnd` names them)."""
        end = RunEnd(
            status=status,
            messages=messages,
            reply=reply,
            error=error,
            usage=usage,
            session_fields=session_fields,
            session_incr=session_incr,
            event=event,
            follow_up_reads=follow_up_reads,
            run_fields=run_fields,
        )
        args, reads = self._finish_args(run_id, session_key, attempt, end)
        res = self._lua["finish_run"](**args)
        return self._finished(run_id, session_key, reads, res, args["messages"])

    def queue_finish(
        self, pipe: Pipeline, run_id: str, session_key: str, attempt: int, end: RunEnd
    ) -> Callable[[Sequence[Any]], FinishResult]:
        """`finish` queued on ``pipe``: answers what reads its reply once the caller
        executed the pipeline (a reply that is an error, as ``execute(raise_on_error=
        False)`` leaves it, is raised there as `StoreUnavailable`)."""
        args, reads = self._finish_args(run_id, session_key, attempt, end)
        at = len(pipe)
        self._lua["finish_run"](**args, client=pipe)

        def read(replies: Sequence[Any]) -> FinishResult:
            reply = replies[at]
            if isinstance(reply, Exception):
                raise unavailable(reply) from reply
            return self._finished(run_id, session_key, reads, reply, args["messages"])

        return read

    def _finish_args(
        self, run_id: str, session_key: str, attempt: int, end: RunEnd
    ) -> tuple[dict[str, Any], str | None]:
        """finish_run.lua's keys and arguments, and the hash it reads for the follow-up
        (None: none, or one in another slot, which the follow-up step reads itself)."""
        fields = {
            "status": end.status,
            "reply": end.reply,
            "error": end.error,
            "usage": dict(end.usage) if end.usage else None,
            "parked": None,
            "attachments": None,  # a spawned child's attachments live as long as its run
            **(end.run_fields or {}),
        }
        sfields = {"status": end.status, **(end.session_fields or {})}
        now = now_ms()
        group = self.ks.beside(session_key)
        reads = end.follow_up_reads
        if reads and self.ks.group_of(reads) != group.group:
            reads = None  # in another slot: the follow-up step reads it itself
        event = end.event
        args = {
            **self._lane_keys(run_id, session_key),
            "lane_queue": self.ks.lane_queue(session_key),
            "waiters": self.ks.run_waiters(run_id),
            "outbox": group.outbox,
            "events": group.events,
            "follow_up": reads or self.ks.run(run_id),
            "cancels": group.cancel_requests,
            "steer": self.ks.steer_inbox(session_key),
            "run_id": run_id,
            "session_key": session_key,
            "now": now,
            "attempt": attempt,
            "run_fields": codec.fields_json(fields),
            "session_fields": codec.fields_json(sfields),
            "session_incr": codec.dumps(dict(end.session_incr)) if end.session_incr else "",
            "retention_s": self.retention_s,
            "lease_at_ms": now + self.lease_s * 1000,
            "channel": "" if self.publish_ends_after_wait else self.ks.run_events,
            "event_type": event[0] if event else "",
            "event_data": codec.dumps(event[1]) if event else "",
            "events_cap": event[2] if event else 0,
            "read_follow_up": "1" if reads else "",
            "steer_taken": end.steer_taken,
            "messages": [codec.dumps(m) for m in end.messages],
        }
        return args, reads

    def _finished(
        self,
        run_id: str,
        session_key: str,
        reads: str | None,
        res: Any,
        appended: Sequence[str],
    ) -> FinishResult:
        """What finish_run.lua answered (``appended``: the messages it wrote, as stored)."""
        verdict = as_text(res[0])
        if verdict == "steered":
            if self.windows is not None and appended:
                self._extend_window(session_key, codec.decode_flat_hash(res[2]), appended)
            steered = tuple(codec.loads(as_text(m)) for m in res[1])
            return FinishResult(applied=False, steered=steered)
        if verdict != "ok":
            return FinishResult(applied=False)
        session = codec.decode_flat_hash(res[3])
        if self.windows is not None and appended:
            self._extend_window(session_key, session, appended)
        ended = codec.decode_flat_hash(res[2])
        if self.publish_ends_after_wait and ended.get("watch") == "1":
            self._publish_end(run_id, ended)
        run = RunRecord.from_hash(run_id, ended)
        if reads:
            run.read_at_end = {
                self.ks.session(session_key): session,
                reads: codec.decode_flat_hash(res[4]),
            }
        return FinishResult(
            applied=True,
            next_run_id=as_text(res[1]) or None,
            waiters=tuple(as_text(w) for w in res[5:]),
            run=run,
        )

    def _extend_window(
        self, session_key: str, session: Mapping[str, str], appended: Sequence[str]
    ) -> None:
        """Add the messages an end step wrote to the process's copy of the session's
        transcript (`TranscriptWindows.extend`): numbered up to the session's counter as
        the step left it."""
        assert self.windows is not None
        last = int(session.get("seq") or 0)
        first = last - len(appended) + 1
        rows = [
            HistoryEntry(seq, m, len(text.encode()))
            for seq, text in enumerate(appended, start=first)
            for m in decode_entries([(f"{seq}-0", {"m": text})])
        ]
        self.windows.extend(session_key, str(session.get("sessionId") or ""), rows)

    def _publish_end(self, run_id: str, ended: Mapping[str, str]) -> None:
        """Publish a watched run's end (as finish_run.lua does) after its WAIT; if Redis
        fails now, the end stands and its waiters find it at their next poll."""
        try:
            self.redis.publish(self.ks.run_events, codec.dumps({"runId": run_id, "run": ended}))
        except StoreUnavailable as exc:
            log.warning("run %s ended; its end was not published (%s)", run_id, exc)

    def park(
        self,
        run_id: str,
        session_key: str,
        attempt: int,
        *,
        calls: Sequence[ParkedCall],
        messages: Sequence[Mapping[str, Any]],
        steer_taken: int = 0,
    ) -> str:
        """Park a run on deferred calls: 'parked', 'ready' (all targets ended) or 'stale'
        (``steer_taken``: the messages of its session's steer inbox among ``messages``)."""
        deadline = max(c.deadline_ms for c in calls)
        keys = self._session_keys(session_key)
        group = self.ks.beside(session_key)
        targets: list[str] = []
        apart: list[str] = []  # targets in other slot groups: registered after the park
        for c in calls:
            for target in c.target_run_ids:
                if self.ks.group_of_id(target) == group.group:
                    targets += [self.ks.run(target), self.ks.run_waiters(target)]
                else:
                    apart.append(target)
        res = self._lua["park_run"](
            run=self.ks.run(run_id),
            session=keys["session"],
            transcript=self.ks.transcript(session_key),
            parked=group.parked_runs,
            leases=group.lane_leases,
            idx_all=keys["idx_all"],
            idx_agent=keys["idx_agent"],
            idx_kind=keys["idx_kind"],
            steer=self.ks.steer_inbox(session_key),
            targets=targets,
            run_id=run_id,
            session_key=session_key,
            now=now_ms(),
            attempt=attempt,
            calls=codec.dumps([c.to_json() for c in calls]),
            deadline_ms=deadline,
            lease_at_ms=deadline + self.lease_s * 1000,
            steer_taken=steer_taken,
            messages=[codec.dumps(m) for m in messages],
        )
        verdict = as_text(res)
        if verdict == "stale" or not apart:
            return verdict
        # Parked first, then registered on each target of another slot group: a target
        # that ends after its registration wakes the run; one that ended before it is
        # counted here as not pending (all ended: 'ready', the caller resumes it).
        pipe = self.redis.pipeline(transaction=False)
        for target in apart:
            self._lua["wait_on_run"](
                client=pipe,
                run=self.ks.run(target),
                waiters=self.ks.run_waiters(target),
                waiter=run_id,
            )
        pending = sum(int(n) for n in pipe.execute())
        return "parked" if pending else verdict

    def release_lane(self, session_key: str, holder: str) -> str | None:
        """Hand a lane whose holder ended or vanished to the next queued run."""
        nxt = self._lua["release_lane"](
            lane=self.ks.lane(session_key),
            lane_queue=self.ks.lane_queue(session_key),
            leases=self.ks.beside(session_key).lane_leases,
            holder=holder,
            session_key=session_key,
            lease_at_ms=now_ms() + self.lease_s * 1000,
        )
        return as_text(nxt) or None

    def expired_leases(self, now: int, limit: int = 500) -> list[str]:
        """Session keys whose lane lease has expired (up to ``limit`` per slot group)."""
        return self._due("lane_leases", now, limit)

    def overdue_parked(self, now: int, limit: int = 500) -> list[str]:
        """Parked runs whose wait deadline has passed (up to ``limit`` per slot group)."""
        return self._due("parked_runs", now, limit)

    def parked(self, limit: int = 500) -> list[str]:
        """Parked runs, the soonest deadlines of each slot group first (at most ``limit``
        per group)."""
        pipe = self.redis.pipeline(transaction=False)
        for group in self.ks.every_group():
            pipe.zrange(group.parked_runs, 0, limit - 1)
        return [as_text(r) for rows in pipe.execute() for r in rows]

    def _due(self, index: str, before_ms: int, limit: int) -> list[str]:
        """The members of every group's ``index`` (a `GroupKeys` name) scored up to
        ``before_ms``, the earliest first in each group, at most ``limit`` per group."""
        indexes = (getattr(group, index) for group in self.ks.every_group())
        return members_due(self.redis, indexes, before_ms=before_ms, limit=limit)

    def push_lease(self, session_key: str, until_ms: int) -> None:
        """Set a lane lease expiry."""
        self.redis.zadd(self.ks.beside(session_key).lane_leases, {session_key: until_ms})

    def push_parked(self, run_id: str, until_ms: int) -> None:
        """Postpone the next overdue check of a parked run."""
        self.redis.zadd(self.ks.beside_id(run_id).parked_runs, {run_id: until_ms}, xx=True)

    def outbox_due(self, before_ms: int, limit: int = 500) -> list[str]:
        """Ended runs whose follow-up was recorded before ``before_ms`` and not confirmed
        (up to ``limit`` per slot group)."""
        return self._due("outbox", before_ms, limit)

    def outbox_done(self, *run_ids: str) -> None:
        """These runs' follow-ups are enqueued (or have run)."""
        by_group: dict[str, list[str]] = {}
        for run_id in run_ids:
            by_group.setdefault(self.ks.beside_id(run_id).outbox, []).append(run_id)
        if len(by_group) == 1:
            [(outbox, members)] = by_group.items()
            self.redis.zrem(outbox, *members)
            return
        pipe = self.redis.pipeline(transaction=False)
        for outbox, members in by_group.items():
            pipe.zrem(outbox, *members)
        pipe.execute()

    def outbox_retry_later(self, run_id: str, at_ms: int) -> None:
        """Look at an outbox entry again at ``at_ms``."""
        self.redis.zadd(self.ks.beside_id(run_id).outbox, {run_id: at_ms}, xx=True)

    def requeue(
        self,
        run_id: str,
        attempt: int | None = None,
        *,
        lapsed: tuple[str, int] | None = None,
    ) -> str:
        """Mark a running run whose worker vanished as queued again ('queued'), or, if it
        was resumed from parked, as parked again ('parked': due for its resume now; the
        caller enqueues it). ``lapsed``: (its session key, a time in ms): only if its
        lane's lease still ends by then (a sweep that saw it lapse; answers 'renewed'
        otherwise). A run not running is left as it is ('not-running': put back by a
        concurrent caller, or ended); 'moved' when another attempt runs it."""
        session_key, lapsed_by = lapsed if lapsed is not None else ("", "")
        group = self.ks.beside_id(run_id)
        res = self._lua["requeue_run"](
            run=self.ks.run(run_id),
            leases=group.lane_leases,
            parked=group.parked_runs,
            attempt="" if attempt is None else attempt,
            session_key=session_key,
            lapsed_by_ms=lapsed_by,
            run_id=run_id,
            now_ms=now_ms(),
        )
        return as_text(res)

    # -- cancel (`subagents cancel`) --------------------------------------------------
    def cancel(self, run_id: str, session_key: str, *, error: str) -> CancelResult:
        """End a queued or parked run as ``cancelled`` now, or ask the worker executing a
        running one to stop it (cancel_run.lua)."""
        now = now_ms()
        group = self.ks.beside(session_key)
        res = self._lua["cancel_run"](
            run=self.ks.run(run_id),
            lane=self.ks.lane(session_key),
            lane_queue=self.ks.lane_queue(session_key),
            leases=group.lane_leases,
            parked=group.parked_runs,
            session=self.ks.session(session_key),
            waiters=self.ks.run_waiters(run_id),
            outbox=group.outbox,
            events=group.events,
            cancels=group.cancel_requests,
            run_id=run_id,
            session_key=session_key,
            now=now,
            retention_s=self.retention_s,
            lease_at_ms=now + self.lease_s * 1000,
            channel=self.ks.run_events,
            error=error,
            events_cap=EVENTS_MAXLEN,
            stale_before=now - CANCEL_REQUEST_TTL_MS,
        )
        verdict = as_text(res[0])
        if verdict != "cancelled":
            return CancelResult(verdict, status=as_text(res[1]) if len(res) > 1 else "")
        return CancelResult(
            verdict,
            status="cancelled",
            next_run_id=as_text(res[1]) or None,
            run=RunRecord.from_hash(run_id, codec.decode_flat_hash(res[2])),
            waiters=tuple(as_text(w) for w in res[3:]),
        )

    def cancel_requests(self) -> set[str]:
        """The running runs asked to stop (recent requests: `CANCEL_REQUEST_TTL_MS`)."""
        since = now_ms() - CANCEL_REQUEST_TTL_MS
        pipe = self.redis.pipeline(transaction=False)
        for group in self.ks.every_group():
            pipe.zrangebyscore(group.cancel_requests, since, "+inf")
        return {as_text(r) for rows in pipe.execute() for r in rows}

    def stop_session(self, session_key: str) -> None:
        """Mark a session whose runs are being cancelled: it stops waiting for its
        children (`sessions_yield`), so their late announces start no run in it."""
        self.redis.hdel(self.ks.session(session_key), "yieldedAt", "yieldedRunId", "yieldMessage")

    def set_meta(self, run_id: str, **fields: Any) -> None:
        """Set extra fields on a run hash."""
        enc: dict[str | bytes, str] = {
            k: v for k, v in ((k, codec.encode_value(v)) for k, v in fields.items()) if v
        }
        if enc:
            self.redis.hset(self.ks.run(run_id), mapping=enc)  # type: ignore[arg-type]
