"""Messages for a session's turns other than the one that starts a run: steered into the
turn in flight, or left as notifications for its next turn (``sessions_send`` modes
``steer`` and ``notify``).

A steered message waits in the session's steer inbox (a list, `Keyspace.steer_inbox`)
until a run takes it: the run in flight reads the inbox between its model steps (one
LRANGE, only after a step that called tools), and the step that writes the run's messages
to the transcript (its park or its end, finish_run.lua) removes what it took, so a worker
that dies first leaves the messages for the run's next attempt. The session's
``steerQueued`` field counts them: a claim, resume or end reads the session anyway, and
looks at the inbox only when it is set. Notifications wait in `Keyspace.notices` until
the next run's first claim moves them into the transcript (includes/claim_run.lua).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis import Redis

from switchboard.shared.store import codec
from switchboard.shared.store.codec import as_text
from switchboard.shared.store.keyspace import Keyspace
from switchboard.shared.store.lua_scripts import LuaScripts


class SteerStore:
    """Steer inboxes and notices of sessions (``Keyspace.steer_inbox``, ``notices``)."""

    def __init__(self, redis: Redis, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._lua = LuaScripts(redis)

    def steer(self, session_key: str, holder: str, message: Mapping[str, Any]) -> bool:
        """Append ``message`` to the session's steer inbox if ``holder`` still holds its
        lane, queued, running or parked (steer_push.lua); False: nothing written."""
        verdict = self._lua["steer_push"](
            lane=self.ks.lane(session_key),
            run=self.ks.run(holder),
            session=self.ks.session(session_key),
            steer=self.ks.steer_inbox(session_key),
            holder=holder,
            message=codec.dumps(dict(message)),
        )
        return as_text(verdict) == "steered"

    def take(self, session_key: str, skip: int) -> list[dict[str, Any]]:
        """The steered messages waiting after the first ``skip`` (those a run took
        already), oldest first: one LRANGE."""
        rows = self.redis.lrange(self.ks.steer_inbox(session_key), skip, -1)
        return [codec.loads(row) for row in rows]

    def waiting(self, session_key: str) -> list[dict[str, Any]]:
        """Every steered message not yet written to the transcript, oldest first."""
        return self.take(session_key, 0)

    def notify(self, session_key: str, message: Mapping[str, Any]) -> bool:
        """Leave ``message`` for the session's next turn (notice_push.lua); False when
        the session does not exist."""
        done = self._lua["notice_push"](
            session=self.ks.session(session_key),
            notices=self.ks.notices(session_key),
            message=codec.dumps(dict(message)),
        )
        return bool(int(done))

    def notices(self, session_key: str) -> list[dict[str, Any]]:
        """The notifications waiting for the session's next turn, oldest first."""
        rows = self.redis.lrange(self.ks.notices(session_key), 0, -1)
        return [codec.loads(row) for row in rows]
