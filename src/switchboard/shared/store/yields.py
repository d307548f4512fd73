"""Yielded sessions: the inbox of announces a yielded session collects, and its wakes.

A session that called ``sessions_yield`` carries ``yieldedAt`` (and ``yieldedRunId``,
``yieldMessage``) on its entry. An announce for it is stashed in its yield inbox instead of
its transcript (`append_announce`, one script with the announce's state change), and the
first one opens a wake (the marker, SET when none is open); the wake step takes the inbox
once (`take`) and starts the session's next run with it. See ``flows/yield_wake.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.client import Pipeline

from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts


@dataclass(frozen=True)
class AnnounceLanded:
    """Where an announce went (`YieldStore.append_announce`)."""

    # "appended" (transcript), "stashed" (yield inbox), "moved" (already done), "gone",
    # "not_yielded" (asked to land only in a yield inbox, and the session is not yielded).
    outcome: str
    # The open wake of the session ("" when none): the step to enqueue.
    wake_id: str = ""
    # True when this announce opened that wake.
    opened: bool = False


@dataclass(frozen=True)
class WakeTake:
    """What a wake step took (`YieldStore.take`)."""

    # "taken", "started" or "stale" (another wake's marker, never taken).
    status: str
    run_id: str = ""
    announces: tuple[Mapping[str, Any], ...] = ()
    yield_message: str = ""
    # The run that yielded ("" over /tools/invoke).
    yielded_run_id: str = ""


class YieldStore:
    """Yield inboxes, wake markers and wake hashes (``Keyspace.yield_*``, ``wake``)."""

    def __init__(self, redis: Redis, ks: Keyspace, *, retention_s: int) -> None:
        self.redis = redis
        self.ks = ks
        self.retention_s = retention_s
        self._lua = LuaScripts(redis)

    def mark(self, session_key: str, fields: Mapping[str, Any]) -> bool:
        """Set the yield fields on a session that has a pending child; False (nothing
        written) when it has none."""
        res = self._lua["yield_mark"](
            session=self.ks.session(session_key),
            kids=self.ks.active_children(session_key),
            fields=codec.fields_json(fields),
        )
        return bool(int(res))

    def release_if_idle(self, session_key: str, *, client: Pipeline | None = None) -> None:
        """End a session's yield when no child is pending and nothing waits for a wake
        (queued on ``client`` when given)."""
        self._lua["yield_release"](
            session=self.ks.session(session_key),
            kids=self.ks.active_children(session_key),
            inbox=self.ks.yield_inbox(session_key),
            marker=self.ks.yield_wake(session_key),
            client=client,
        )

    def is_yielded(self, session_key: str) -> bool:
        """Whether the session waits for its children's announces."""
        return bool(self.redis.hexists(self.ks.session(session_key), "yieldedAt"))

    def append_announce(
        self,
        hash_key: str,
        session_key: str,
        message: Mapping[str, Any],
        entry: Mapping[str, Any],
        *,
        field: str,
        expected: str,
        new: str,
        now_ms: int,
        wake_id: str,
        only_yielded: bool = False,
        client: Pipeline | None = None,
    ) -> AnnounceLanded | None:
        """Move ``field`` expected → new and land the announce: in the yield inbox
        (``entry``) when the session is yielded, else in its transcript (``message``), or
        with ``only_yielded`` nowhere ("not_yielded", nothing written). Queued on
        ``client`` (answer None; decode its reply with `landed`)."""
        res = self._lua["yield_announce"](
            record=hash_key,
            session=self.ks.session(session_key),
            transcript=self.ks.transcript(session_key),
            inbox=self.ks.yield_inbox(session_key),
            marker=self.ks.yield_wake(session_key),
            field=field,
            expected=expected,
            new=new,
            message=codec.dumps(dict(message)),
            entry=codec.dumps(dict(entry)),
            now=now_ms,
            wake_id=wake_id,
            only_yielded="1" if only_yielded else "",
            client=client,
        )
        return None if client is not None else self.landed(res)

    @staticmethod
    def landed(reply: Any) -> AnnounceLanded:
        """Decode `yield_announce`'s reply."""
        code, wake = int(reply[0]), as_text(reply[1])
        if code > 0:
            return AnnounceLanded("appended")
        if code == -2:
            return AnnounceLanded("stashed", wake, opened=int(reply[2]) == 1)
        if code == -3:
            return AnnounceLanded("not_yielded")
        return AnnounceLanded("moved" if code == 0 else "gone", wake)

    def take(self, session_key: str, wake_id: str, now_ms: int) -> WakeTake:
        """Take the session's inbox for wake ``wake_id`` (once; again: what it took)."""
        res = self._lua["yield_take"](
            wake=self.ks.wake(wake_id),
            marker=self.ks.yield_wake(session_key),
            inbox=self.ks.yield_inbox(session_key),
            session=self.ks.session(session_key),
            kids=self.ks.active_children(session_key),
            wake_id=wake_id,
            session_key=session_key,
            now=now_ms,
            retention_s=self.retention_s,
        )
        status = as_text(res[0])
        if status == "stale":
            return WakeTake("stale")
        announces = codec.loads(as_text(res[2]) or "[]")
        return WakeTake(
            status,
            run_id=as_text(res[1]),
            announces=tuple(a for a in announces if isinstance(a, dict)),
            yield_message=as_text(res[3]),
            yielded_run_id=as_text(res[4]) if len(res) > 4 else "",
        )

    def started(self, wake_id: str, run_id: str) -> None:
        """Record the run a wake started."""
        self.redis.hset(self.ks.wake(wake_id), mapping={"status": "started", "runId": run_id})

    def get_wake(self, wake_id: str) -> dict[str, str]:
        """A wake hash ({} when unknown or expired)."""
        return codec.decode_hash(self.redis.hgetall(self.ks.wake(wake_id)))

    def open_wake(self, session_key: str) -> str:
        """The session's open wake id ("" when none)."""
        return as_text(self.redis.get(self.ks.yield_wake(session_key)))

    def inbox_length(self, session_key: str) -> int:
        """How many announces wait in the session's yield inbox."""
        return int(self.redis.llen(self.ks.yield_inbox(session_key)))
