"""Every Redis key pattern the product uses, and every TTL, in one place.

All keys live under one prefix (default ``sb:``). Celery's own broker keys are separate
(kombu names them); Celery messages carry ids only, everything else is here.
"""

from __future__ import annotations

from dataclasses import dataclass

# How long an `agent` idempotency key maps to its run (a retried call gets the same run).
IDEMPOTENCY_TTL_S = 600
# Default lease a run holds on its session lane (SWITCHBOARD_LANE_LEASE_S); the worker
# renews it every third of that while the run executes.
LANE_LEASE_S = 30
# The events stream is capped near this many entries (XADD MAXLEN ~).
EVENTS_MAXLEN = 10_000
# How long an OpenAI Responses API response id stays known (its session can be continued
# with `previous_response_id`); its output lives on its run (`runs.retentionHours`).
RESPONSE_TTL_S = 30 * 24 * 3600
# The audit stream of scoped-token calls is capped near this many entries (XADD MAXLEN ~).
AUDIT_MAXLEN = 100_000


@dataclass(frozen=True)
class Keyspace:
    """Builds key names under one prefix; the one module that knows their shapes."""

    prefix: str = "sb:"

    # -- sessions ---------------------------------------------------------------------
    def session(self, key: str) -> str:
        """Hash: one session entry (sessionId, updatedAt, channel, usage, policy, …)."""
        return f"{self.prefix}s:{key}"

    @property
    def session_ids(self) -> str:
        """Hash: sessionId → canonical session key."""
        return f"{self.prefix}idx:sid"

    @property
    def labels(self) -> str:
        """Hash: label → canonical session key (labels are unique)."""
        return f"{self.prefix}idx:label"

    @property
    def updated_all(self) -> str:
        """Sorted set: every session key scored by updatedAt (ms)."""
        return f"{self.prefix}idx:upd"

    def updated_agent(self, agent_id: str) -> str:
        """Sorted set: one agent's session keys by updatedAt (ms)."""
        return f"{self.prefix}idx:upd:{agent_id}"

    def updated_kind(self, agent_id: str, kind: str) -> str:
        """Sorted set: one agent's sessions of one kind by updatedAt (ms)."""
        return f"{self.prefix}idx:upd:{agent_id}:{kind}"

    def children(self, key: str) -> str:
        """Sorted set: sessions spawned by ``key``, scored by creation time (ms)."""
        return f"{self.prefix}idx:children:{key}"

    # -- transcripts ------------------------------------------------------------------
    def transcript(self, key: str) -> str:
        """Stream: the session transcript; entry id ``<seq>-0``, field ``m`` = JSON message."""
        return f"{self.prefix}t:{key}"

    # -- runs -------------------------------------------------------------------------
    def run(self, run_id: str) -> str:
        """Hash: one agent run (status, timestamps, reply, usage, attempts, deadline).

        Expires ``runs.retentionHours`` after the run ends."""
        return f"{self.prefix}r:{run_id}"

    def run_waiters(self, run_id: str) -> str:
        """Set: parked runs waiting on this run (``<parkedRunId>``); expires with the run."""
        return f"{self.prefix}r:{run_id}:waiters"

    def idempotency(self, session_key: str, idem_key: str) -> str:
        """String: the run started for an idempotency key; IDEMPOTENCY_TTL_S."""
        return f"{self.prefix}idem:{session_key}:{idem_key}"

    @property
    def active_runs(self) -> str:
        """Sorted set: runs started and not ended, scored by their deadline (ms)."""
        return f"{self.prefix}idx:active"

    @property
    def parked_runs(self) -> str:
        """Sorted set: parked runs scored by the deadline of the wait they park on (ms)."""
        return f"{self.prefix}idx:parked"

    @property
    def run_events(self) -> str:
        """Pub/sub channel: when a run someone waits for ends, ``{"runId", "run": {its hash}}``
        (JSON); see `RunWaiter`."""
        return f"{self.prefix}ch:runs"

    @property
    def pending_steps(self) -> str:
        """Sorted set: flow steps enqueued and not yet run (JSON ``[task, *args]``), scored
        by when the sweep presumes them lost with their worker and enqueues them again (ms)."""
        return f"{self.prefix}idx:steps"

    @property
    def outbox(self) -> str:
        """Sorted set: ended runs whose follow-up step is not yet confirmed enqueued (ms)."""
        return f"{self.prefix}idx:outbox"

    @property
    def cancel_requests(self) -> str:
        """Sorted set: running runs `subagents cancel` asked to stop, scored by when (ms);
        the worker executing one stops it and removes it."""
        return f"{self.prefix}idx:cancel"

    # -- session lanes ----------------------------------------------------------------
    def lane(self, key: str) -> str:
        """String: the run that holds the session's lane (one run at a time per session)."""
        return f"{self.prefix}lane:{key}"

    def lane_queue(self, key: str) -> str:
        """List: runs waiting for the session's lane, oldest first."""
        return f"{self.prefix}laneq:{key}"

    @property
    def lane_leases(self) -> str:
        """Sorted set: session keys with a held lane, scored by lease expiry (ms)."""
        return f"{self.prefix}idx:leases"

    # -- reply-back flows (sessions_send) ----------------------------------------------
    def flow(self, flow_id: str) -> str:
        """Hash: one reply-back flow (requester, target, turn, max turns, replies, announce
        status, delivery id); expires ``runs.retentionHours`` after it ends."""
        return f"{self.prefix}flow:{flow_id}"

    def session_flows(self, key: str) -> str:
        """Sorted set: flows a session requested or was sent, by creation time (ms)."""
        return f"{self.prefix}idx:flows:{key}"

    # -- deliveries ---------------------------------------------------------------------
    def delivery(self, delivery_id: str) -> str:
        """Hash: one outbound delivery (target, message, status, attempts, last error)."""
        return f"{self.prefix}dlv:{delivery_id}"

    def session_deliveries(self, key: str) -> str:
        """Sorted set: delivery ids concerning a session, by creation time (ms)."""
        return f"{self.prefix}idx:dlv:{key}"

    @property
    def deliveries_due(self) -> str:
        """Sorted set: unsettled delivery ids by when the sweep must (re-)enqueue their step
        (ms): the next retry, the end of a sending attempt's lease, or a first step presumed
        lost; removed when the delivery settles."""
        return f"{self.prefix}idx:dlvdue"

    @property
    def events(self) -> str:
        """Stream: webchat/console events (deliveries, run ends), capped ~10k entries."""
        return f"{self.prefix}events"

    # -- spawns -------------------------------------------------------------------------
    def spawn(self, spawn_id: str) -> str:
        """Hash: one sub-agent spawn (child key, requester, run id, task, outcome,
        announce status, cleanup, batch id)."""
        return f"{self.prefix}spawn:{spawn_id}"

    def spawns_of(self, key: str) -> str:
        """Sorted set: spawn ids ``key`` requested, scored by creation time (ms)."""
        return f"{self.prefix}idx:spawns:{key}"

    def active_children(self, key: str) -> str:
        """Set: child session keys of ``key`` whose spawn has not finished announcing."""
        return f"{self.prefix}kids:{key}"

    def batch(self, batch_id: str) -> str:
        """Hash: one batch fan-out (requester, join mode, expected count, joined flag)."""
        return f"{self.prefix}batch:{batch_id}"

    def batch_done(self, batch_id: str) -> str:
        """Set: spawn ids of a batch that have finished (set size = completion count)."""
        return f"{self.prefix}batch:{batch_id}:done"

    # -- sessions_yield --------------------------------------------------------------
    def yield_inbox(self, key: str) -> str:
        """List: announces (JSON) that reached ``key`` while it was yielded, not yet taken
        by a wake run; deleted when taken."""
        return f"{self.prefix}yinbox:{key}"

    def yield_wake(self, key: str) -> str:
        """String: the id of the wake step that will take ``key``'s yield inbox (set by the
        first announce after the last take); deleted when taken."""
        return f"{self.prefix}ywake:{key}"

    def wake(self, wake_id: str) -> str:
        """Hash: one wake of a yielded session (session, the announces it took, the yield
        message, status taken | started, run id); retention."""
        return f"{self.prefix}wake:{wake_id}"

    @property
    def archive_due(self) -> str:
        """Sorted set: sub-agent session keys scored by when they are archived (ms)."""
        return f"{self.prefix}idx:archive"

    # -- collectors (sessions_spawn collect, agents_wait) ------------------------------
    def collector(self, run_id: str) -> str:
        """Hash: one collector child, by its run id (requester, output schema, group; once
        completed: status, result, structured or schemaError, usage, completion seq)."""
        return f"{self.prefix}col:{run_id}"

    def collect_log(self, key: str) -> str:
        """Stream: completions of ``key``'s collector children, in completion order."""
        return f"{self.prefix}col:log:{key}"

    def collect_group(self, key: str, group_id: str) -> str:
        """Hash: one collector group of ``key`` (``active``, ``total`` children)."""
        return f"{self.prefix}col:grp:{key}:{group_id}"

    # -- api --------------------------------------------------------------------------
    def auth_failures(self, client: str) -> str:
        """String: failed token checks from one client IP; expires with its window
        (SWITCHBOARD_AUTH_FAILURE_WINDOW_S)."""
        return f"{self.prefix}authfail:{client}"

    def response(self, response_id: str) -> str:
        """Hash: one OpenAI Responses API response (its run, session, agent, previous
        response, instructions, background flag); RESPONSE_TTL_S."""
        return f"{self.prefix}resp:{response_id}"

    def a2a_task(self, task_id: str) -> str:
        """Hash: one A2A task (its agent, run, session, the task object as JSON, state,
        last update); runs.retentionHours from its last write."""
        return f"{self.prefix}a2a:task:{task_id}"

    def a2a_tasks(self, agent_id: str) -> str:
        """Zset: one agent's A2A task ids by last update (ListTasks); runs.retentionHours."""
        return f"{self.prefix}a2a:tasks:{agent_id}"

    def a2a_push(self, task_id: str) -> str:
        """Hash: one A2A task's push-notification configs (config id -> who set it and the
        config); runs.retentionHours from its last write."""
        return f"{self.prefix}a2a:push:{task_id}"

    def api_token(self, token_id: str) -> str:
        """Hash: one scoped api token (sha256 of its secret, agent, session, tools, label,
        created, last used, expiry); expires with the token (`--ttl`), deleted on revoke."""
        return f"{self.prefix}tok:{token_id}"

    @property
    def api_tokens(self) -> str:
        """Sorted set: scoped token ids by creation time (ms); an expired one is dropped
        when a listing finds its hash gone."""
        return f"{self.prefix}idx:tok"

    @property
    def audit(self) -> str:
        """Stream: one entry per call made with a scoped token (token id, surface, tool,
        session key, outcome), capped ~AUDIT_MAXLEN entries."""
        return f"{self.prefix}audit"

    # -- maintenance ------------------------------------------------------------------
    @property
    def metrics(self) -> str:
        """Hash: cluster-wide counters (``shared/metrics.py`` names the fields); no TTL."""
        return f"{self.prefix}metrics"

    @property
    def beat_marks(self) -> str:
        """Hash: sweep name → last time it ran (ms), for health checks."""
        return f"{self.prefix}beat"

    @property
    def apis(self) -> str:
        """Hash: api id → JSON heartbeat (host, pid, url, seen ms), for health checks."""
        return f"{self.prefix}apis"
