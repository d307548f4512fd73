"""A2A task records: what an A2A task id names, and the task as last written.

An A2A task is one run of one agent in one session (the task's `contextId` names the
session). Its record keeps the run it maps to, the session, the agent, and the task itself
(the A2A `Task` object as JSON, written whole on every change), so a task outlives the api
process that started it. Each agent's task ids are indexed by last update (for
`ListTasks`). A task's push-notification configs are kept beside it, one hash field per
setter and config id (``<owner>/<config id>``, holding the setter and the config as
JSON): each setter has config ids of its own, so none can overwrite, read or delete
another's. Records, the index and the configs
expire ``retention_s`` after their last write, like the runs they name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from redis import Redis

from switchboard.shared.store import codec
from switchboard.shared.store.keyspace import Keyspace


@dataclass(frozen=True)
class A2ATaskRecord:
    """One A2A task as stored."""

    task_id: str
    agent_id: str
    task_json: str | None = None  # the A2A Task object, as written last
    state: str | None = None  # its status state, e.g. TASK_STATE_WORKING
    updated_at_ms: int = 0
    run_id: str | None = None
    session_key: str | None = None

    @classmethod
    def from_hash(cls, task_id: str, h: Mapping[str, str]) -> A2ATaskRecord:
        """Build from a decoded HGETALL reply."""
        return cls(
            task_id=task_id,
            agent_id=h.get("agentId", ""),
            task_json=h.get("task"),
            state=h.get("state"),
            updated_at_ms=codec.as_int(h.get("updatedAt")) or 0,
            run_id=h.get("runId") or None,
            session_key=h.get("sessionKey") or None,
        )


class A2ATaskStore:
    """A2A task records (``Keyspace.a2a_task``) and each agent's index
    (``Keyspace.a2a_tasks``), expiring ``retention_s`` after their last write."""

    def __init__(self, redis: Redis, ks: Keyspace, *, retention_s: int) -> None:
        self.redis = redis
        self.ks = ks
        self.retention_s = retention_s

    def save_task(
        self, agent_id: str, task_id: str, task_json: str, state: str, updated_at_ms: int
    ) -> None:
        """Write the task (its run and session fields kept) and index it, in one step."""
        key = self.ks.a2a_task(task_id)
        index = self.ks.a2a_tasks(agent_id)
        fields = {"agentId": agent_id, "task": task_json, "state": state}
        fields["updatedAt"] = str(updated_at_ms)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping=fields)  # type: ignore[arg-type]
        pipe.expire(key, self.retention_s)
        pipe.zadd(index, {task_id: updated_at_ms})
        pipe.zremrangebyscore(index, "-inf", updated_at_ms - self.retention_s * 1000)
        pipe.expire(index, self.retention_s)
        pipe.execute()

    def link_run(self, agent_id: str, task_id: str, run_id: str, session_key: str) -> None:
        """Record the run the task maps to and its session."""
        key = self.ks.a2a_task(task_id)
        pipe = self.redis.pipeline(transaction=True)
        mapping = {"agentId": agent_id, "runId": run_id, "sessionKey": session_key}
        pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
        pipe.expire(key, self.retention_s)
        pipe.execute()

    def get(self, task_id: str) -> A2ATaskRecord | None:
        """The record, or None when unknown, expired or not yet written."""
        raw = self.redis.hgetall(self.ks.a2a_task(task_id))
        return A2ATaskRecord.from_hash(task_id, codec.decode_hash(raw)) if raw else None

    def for_agent(self, agent_id: str) -> list[A2ATaskRecord]:
        """The agent's tasks holding a task object, most recently updated first (ids whose
        record expired are dropped from the index)."""
        index = self.ks.a2a_tasks(agent_id)
        ids = [codec.as_text(i) for i in self.redis.zrevrange(index, 0, -1)]
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for task_id in ids:
            pipe.hgetall(self.ks.a2a_task(task_id))
        out, gone = [], []
        for task_id, raw in zip(ids, pipe.execute(), strict=True):
            rec = A2ATaskRecord.from_hash(task_id, codec.decode_hash(raw)) if raw else None
            if rec is None:
                gone.append(task_id)
            elif rec.task_json is not None and rec.agent_id == agent_id:
                out.append(rec)
        if gone:
            self.redis.zrem(index, *gone)
        return out

    def delete(self, agent_id: str, task_id: str) -> None:
        """Forget the task and its push-notification configs."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.ks.a2a_task(task_id), self.ks.a2a_push(task_id))
        pipe.zrem(self.ks.a2a_tasks(agent_id), task_id)
        pipe.execute()

    # -- push-notification configs -----------------------------------------------------
    def set_push(self, task_id: str, config_id: str, owner: str, config_json: str) -> None:
        """Write one of ``owner``'s push-notification configs of the task (replacing its
        own of the same id, never another owner's)."""
        key = self.ks.a2a_push(task_id)
        value = codec.dumps({"owner": owner, "config": config_json})
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, _push_field(owner, config_id), value)
        pipe.expire(key, self.retention_s)
        pipe.execute()

    def push_configs(self, task_id: str, owner: str | None = None) -> list[tuple[str, str]]:
        """The task's push-notification configs as (owner, config JSON), by setter and
        config id: ``owner``'s only when given, everyone's (to send them) when None."""
        raw = codec.decode_hash(self.redis.hgetall(self.ks.a2a_push(task_id)))
        out = []
        for field_name, value in sorted(raw.items()):
            entry = codec.as_json(value, {})
            if not isinstance(entry, dict) or not isinstance(entry.get("config"), str):
                continue
            setter = str(entry.get("owner", ""))
            if owner is None or (setter == owner and field_name.startswith(f"{owner}/")):
                out.append((setter, entry["config"]))
        return out

    def delete_push(self, task_id: str, owner: str, config_id: str) -> None:
        """Forget one of ``owner``'s push-notification configs of the task."""
        self.redis.hdel(self.ks.a2a_push(task_id), _push_field(owner, config_id))


def _push_field(owner: str, config_id: str) -> str:
    """The hash field of one setter's config: its own namespace of config ids."""
    return f"{owner}/{config_id}"
