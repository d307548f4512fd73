"""Every Redis key pattern the product uses, and every TTL, in one place.

All keys live under one prefix (default ``sb:``). Celery's own broker keys are separate
(kombu names them); Celery messages carry ids only, everything else is here.

Keys are cut into slot groups (`slot_groups` says how and why): with one group (the
default) a key is ``sb:<rest>``; with several, group g's keys are ``sb:{g}:<rest>``, the
hash tag keeping what one step touches on one Redis Cluster slot. A session's keys and
the records named by ids made for it are in its group (`Keyspace`); the indexes every
session adds to (updatedAt, leases, parked runs, the outbox, events…) are kept per group
(`GroupKeys`), and a reader of all of them reads each group's. What belongs to no session
(labels, tokens, the audit, api heartbeats, beat marks) is in group 0, the home group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from switchboard.shared.store import slot_groups

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
class GroupKeys:
    """The keys of one slot group that every session of the group adds to: its share of
    the indexes and events (one group: the whole of each)."""

    prefix: str
    group: int

    # -- sessions ---------------------------------------------------------------------
    @property
    def session_ids(self) -> str:
        """Hash: sessionId → canonical session key (ids made for the group: `new_id`)."""
        return f"{self.prefix}idx:sid"

    @property
    def updated_all(self) -> str:
        """Sorted set: every session key of the group scored by updatedAt (ms)."""
        return f"{self.prefix}idx:upd"

    def updated_agent(self, agent_id: str) -> str:
        """Sorted set: one agent's session keys by updatedAt (ms)."""
        return f"{self.prefix}idx:upd:{agent_id}"

    def updated_kind(self, agent_id: str, kind: str) -> str:
        """Sorted set: one agent's sessions of one kind by updatedAt (ms)."""
        return f"{self.prefix}idx:upd:{agent_id}:{kind}"

    # -- runs -------------------------------------------------------------------------
    @property
    def parked_runs(self) -> str:
        """Sorted set: parked runs scored by the deadline of the wait they park on (ms)."""
        return f"{self.prefix}idx:parked"

    @property
    def pending_steps(self) -> str:
        """Sorted set: flow steps enqueued and not yet run (JSON ``[task, *args]``), scored
        by when the sweep presumes them lost with their worker and enqueues them again (ms);
        a step is in the group of its first argument (the id of what it advances)."""
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

    @property
    def lane_leases(self) -> str:
        """Sorted set: session keys with a held lane, scored by lease expiry (ms)."""
        return f"{self.prefix}idx:leases"

    # -- deliveries, events, archive -----------------------------------------------------
    @property
    def deliveries_due(self) -> str:
        """Sorted set: unsettled delivery ids by when the sweep must (re-)enqueue their step
        (ms): the next retry, the end of a sending attempt's lease, or a first step presumed
        lost; removed when the delivery settles."""
        return f"{self.prefix}idx:dlvdue"

    @property
    def events(self) -> str:
        """Stream: webchat/console events (deliveries, run ends) of the group's sessions,
        capped ~10k entries."""
        return f"{self.prefix}events"

    @property
    def archive_due(self) -> str:
        """Sorted set: sub-agent session keys scored by when they are archived (ms)."""
        return f"{self.prefix}idx:archive"


@dataclass(frozen=True)
class Keyspace:
    """Builds key names under one prefix, in ``groups`` slot groups; the one module that
    knows their shapes."""

    prefix: str = "sb:"
    groups: int = 1
    _by_group: tuple[GroupKeys, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.groups < 1:
            raise ValueError(f"slot groups must be 1 or more, not {self.groups}")
        if self.groups > 1 and ("{" in self.prefix or "}" in self.prefix):
            raise ValueError(
                f"with {self.groups} slot groups the key prefix holds no {{hash tag}} of its "
                f"own (each group's keys get theirs): {self.prefix!r}"
            )
        made = tuple(GroupKeys(self._group_prefix(g), g) for g in range(self.groups))
        object.__setattr__(self, "_by_group", made)

    def _group_prefix(self, group: int) -> str:
        if self.groups == 1:
            return self.prefix
        return f"{self.prefix}{{{slot_groups.group_tags(self.groups)[group]}}}:"

    # -- slot groups ----------------------------------------------------------------------
    def at(self, group: int) -> GroupKeys:
        """Group ``group``'s own keys."""
        return self._by_group[group]

    def beside(self, session_key: str) -> GroupKeys:
        """The own keys of a session's group."""
        return self._by_group[self.group_of_key(session_key)]

    def beside_id(self, record_id: str) -> GroupKeys:
        """The own keys of the group of a record named by ``record_id``."""
        return self._by_group[self.group_of_id(record_id)]

    @property
    def home(self) -> GroupKeys:
        """Group 0, where what belongs to no session lives."""
        return self._by_group[0]

    def every_group(self) -> tuple[GroupKeys, ...]:
        """Every group's own keys, in group order (what a reader of all of them reads)."""
        return self._by_group

    def group_of_key(self, session_key: str) -> int:
        """The group of a session (`slot_groups.group_of_key`)."""
        return slot_groups.group_of_key(session_key, self.groups)

    def group_of_id(self, record_id: str) -> int:
        """The group of a record named by an id (`slot_groups.group_of_id`)."""
        return slot_groups.group_of_id(record_id, self.groups)

    def group_of(self, redis_key: str) -> int:
        """The group of a key this keyspace built (read from its hash tag); -1 for a key
        it did not build (in no group: a step never joins it to a group's keys)."""
        if self.groups == 1:
            return 0
        head, _, tagged = redis_key.partition(self.prefix + "{")
        tag, closed, _ = tagged.partition("}")
        if head or not closed or not tag.replace(".", "", 1).isdigit():
            return -1
        return slot_groups.group_of_tag(tag)

    def new_id(self, group: int = 0) -> str:
        """A fresh UUID4 id for a record of group ``group`` (`slot_groups.new_id`)."""
        return slot_groups.new_id(group, self.groups)

    def new_id_beside(self, session_key: str) -> str:
        """A fresh id for a record of a session's group (its run, a flow sent to it, a
        spawn it makes, its sessionId)."""
        return slot_groups.new_id(self.group_of_key(session_key), self.groups)

    def _s(self, session_key: str) -> str:
        """The prefix of a session's keys."""
        if self.groups == 1:
            return self.prefix
        return self._by_group[self.group_of_key(session_key)].prefix

    def _r(self, record_id: str) -> str:
        """The prefix of the keys of a record named by an id."""
        if self.groups == 1:
            return self.prefix
        return self._by_group[self.group_of_id(record_id)].prefix

    # -- sessions ---------------------------------------------------------------------
    def session(self, key: str) -> str:
        """Hash: one session entry (sessionId, updatedAt, channel, usage, policy, …)."""
        return f"{self._s(key)}s:{key}"

    @property
    def updated_agent_match(self) -> str:
        """A SCAN pattern matching every group's per-agent updatedAt index names (and
        the per-kind ones beneath them)."""
        if self.groups == 1:
            return f"{self.prefix}idx:upd:*"
        return f"{self.prefix}{{*}}:idx:upd:*"

    def session_ids_of(self, session_id: str) -> str:
        """The sessionId index of a sessionId's group (`GroupKeys.session_ids`)."""
        return self.beside_id(session_id).session_ids

    @property
    def labels(self) -> str:
        """Hash: label → canonical session key (labels are unique); home group."""
        return f"{self.home.prefix}idx:label"

    def children(self, key: str) -> str:
        """Sorted set: sessions spawned by ``key``, scored by creation time (ms)."""
        return f"{self._s(key)}idx:children:{key}"

    # -- transcripts ------------------------------------------------------------------
    def transcript(self, key: str) -> str:
        """Stream: the session transcript; entry id ``<seq>-0``, field ``m`` = JSON message."""
        return f"{self._s(key)}t:{key}"

    # -- runs -------------------------------------------------------------------------
    def run(self, run_id: str) -> str:
        """Hash: one agent run (status, timestamps, reply, usage, attempts, deadline).

        Expires ``runs.retentionHours`` after the run ends."""
        return f"{self._r(run_id)}r:{run_id}"

    def run_waiters(self, run_id: str) -> str:
        """Set: parked runs waiting on this run (``<parkedRunId>``); expires with the run."""
        return f"{self._r(run_id)}r:{run_id}:waiters"

    def idempotency(self, session_key: str, idem_key: str) -> str:
        """String: the run started for an idempotency key; IDEMPOTENCY_TTL_S."""
        return f"{self._s(session_key)}idem:{session_key}:{idem_key}"

    @property
    def run_events(self) -> str:
        """Pub/sub channel: when a run someone waits for ends, ``{"runId", "run": {its hash}}``
        (JSON); see `RunWaiter`. (A channel, not a key: a cluster's nodes all carry it.)"""
        return f"{self.home.prefix}ch:runs"

    # -- session lanes ----------------------------------------------------------------
    def lane(self, key: str) -> str:
        """String: the run that holds the session's lane (one run at a time per session)."""
        return f"{self._s(key)}lane:{key}"

    def lane_queue(self, key: str) -> str:
        """List: runs waiting for the session's lane, oldest first."""
        return f"{self._s(key)}laneq:{key}"

    def steer_inbox(self, key: str) -> str:
        """List: messages steered into the session's running turn (transcript-form JSON),
        oldest first; a run takes them between its model steps, and they are removed by
        the step that writes them to the transcript (its park or end)."""
        return f"{self._s(key)}steer:{key}"

    def notices(self, key: str) -> str:
        """List: notifications for the session's next turn (transcript-form JSON), oldest
        first; the next run's first claim moves them into the transcript."""
        return f"{self._s(key)}notice:{key}"

    # -- reply-back flows (sessions_send) ----------------------------------------------
    def flow(self, flow_id: str) -> str:
        """Hash: one reply-back flow (requester, target, turn, max turns, replies, announce
        status, delivery id), in its target's group; expires ``runs.retentionHours`` after
        it ends."""
        return f"{self._r(flow_id)}flow:{flow_id}"

    def session_flows(self, key: str) -> str:
        """Sorted set: flows a session requested or was sent, by creation time (ms)."""
        return f"{self._s(key)}idx:flows:{key}"

    # -- deliveries ---------------------------------------------------------------------
    def delivery(self, delivery_id: str) -> str:
        """Hash: one outbound delivery (target, message, status, attempts, last error)."""
        return f"{self._r(delivery_id)}dlv:{delivery_id}"

    def session_deliveries(self, key: str) -> str:
        """Sorted set: delivery ids concerning a session, by creation time (ms)."""
        return f"{self._s(key)}idx:dlv:{key}"

    # -- spawns -------------------------------------------------------------------------
    def spawn(self, spawn_id: str) -> str:
        """Hash: one sub-agent spawn (child key, requester, run id, task, outcome,
        announce status, cleanup, batch id)."""
        return f"{self._r(spawn_id)}spawn:{spawn_id}"

    def spawns_of(self, key: str) -> str:
        """Sorted set: spawn ids ``key`` requested, scored by creation time (ms)."""
        return f"{self._s(key)}idx:spawns:{key}"

    def active_children(self, key: str) -> str:
        """Set: child session keys of ``key`` whose spawn has not finished announcing."""
        return f"{self._s(key)}kids:{key}"

    def batch(self, batch_id: str) -> str:
        """Hash: one batch fan-out (requester, join mode, expected count, joined flag)."""
        return f"{self._r(batch_id)}batch:{batch_id}"

    def batch_done(self, batch_id: str) -> str:
        """Set: spawn ids of a batch that have finished (set size = completion count)."""
        return f"{self._r(batch_id)}batch:{batch_id}:done"

    # -- sessions_yield --------------------------------------------------------------
    def yield_inbox(self, key: str) -> str:
        """List: announces (JSON) that reached ``key`` while it was yielded, not yet taken
        by a wake run; deleted when taken."""
        return f"{self._s(key)}yinbox:{key}"

    def yield_wake(self, key: str) -> str:
        """String: the id of the wake step that will take ``key``'s yield inbox (set by the
        first announce after the last take); deleted when taken."""
        return f"{self._s(key)}ywake:{key}"

    def wake(self, wake_id: str) -> str:
        """Hash: one wake of a yielded session (session, the announces it took, the yield
        message, status taken | started, run id); retention."""
        return f"{self._r(wake_id)}wake:{wake_id}"

    # -- collectors (sessions_spawn collect, agents_wait) ------------------------------
    def collector(self, run_id: str) -> str:
        """Hash: one collector child, by its run id (requester, output schema, group; once
        completed: status, result, structured or schemaError, usage, completion seq)."""
        return f"{self._r(run_id)}col:{run_id}"

    def collect_log(self, key: str) -> str:
        """Stream: completions of ``key``'s collector children, in completion order."""
        return f"{self._s(key)}col:log:{key}"

    def collect_group(self, key: str, group_id: str) -> str:
        """Hash: one collector group of ``key`` (``active``, ``total`` children)."""
        return f"{self._s(key)}col:grp:{key}:{group_id}"

    # -- tool servers (fleet-wide limits) -------------------------------------------------
    def tool_slots(self, server: str) -> str:
        """Sorted set: the calls holding one of a tool server's ``maxConcurrent`` slots,
        holder id -> lease end (ms, Redis's clock); in the group of ``tool:<server>``, and
        expiring with its last lease (`ToolSlotStore`)."""
        return f"{self._s('tool:' + server)}tslots:{server}"

    def tool_slot_queue(self, server: str) -> str:
        """Sorted set: the processes with calls waiting for a slot of a tool server, in
        line (process id -> ticket); beside `tool_slots`."""
        return f"{self._s('tool:' + server)}tslots:{server}:q"

    def tool_slot_seen(self, server: str) -> str:
        """Hash: process id -> when it last asked for a slot of a tool server (ms, Redis's
        clock); a process in line not seen for a while is dropped (it died)."""
        return f"{self._s('tool:' + server)}tslots:{server}:seen"

    # -- api (home group) ---------------------------------------------------------------
    def auth_failures(self, client: str) -> str:
        """String: failed token checks from one client IP; expires with its window
        (SWITCHBOARD_AUTH_FAILURE_WINDOW_S)."""
        return f"{self.home.prefix}authfail:{client}"

    def response(self, response_id: str) -> str:
        """Hash: one OpenAI Responses API response (its run, session, agent, previous
        response, instructions, background flag); RESPONSE_TTL_S."""
        return f"{self.home.prefix}resp:{response_id}"

    # -- OpenAI Files and Batches API (home group) ----------------------------------------
    def file(self, file_id: str) -> str:
        """Hash: one uploaded or produced file (filename, purpose, bytes, lines, owner,
        created); `batches.retentionHours`."""
        return f"{self.home.prefix}ofile:{file_id}"

    def file_lines(self, file_id: str) -> str:
        """List: a file's lines (bytes, without their newline), in order; as its hash."""
        return f"{self.home.prefix}ofile:{file_id}:lines"

    def files_of(self, owner: str) -> str:
        """Sorted set: the file ids one owner (a token id, or ``owner``) made, by creation (ms)."""
        return f"{self.home.prefix}idx:ofiles:{owner}"

    def obatch(self, batch_id: str) -> str:
        """Hash: one batch of the Batches API (endpoint, input file, status, counts, the
        admission cursor, its cap, output and error files, timestamps, owner)."""
        return f"{self.home.prefix}obatch:{batch_id}"

    def obatch_plans(self, batch_id: str) -> str:
        """List: a batch's lines as validated (JSON: custom id, agent, text, session), by line."""
        return f"{self.home.prefix}obatch:{batch_id}:plans"

    def obatch_runs(self, batch_id: str) -> str:
        """Hash: line number -> the run started for it."""
        return f"{self.home.prefix}obatch:{batch_id}:runs"

    def obatch_inflight(self, batch_id: str) -> str:
        """Sorted set: line numbers admitted and not yet answered (at most the batch's
        cap), scored by when they were admitted (ms)."""
        return f"{self.home.prefix}obatch:{batch_id}:inflight"

    def obatch_done(self, batch_id: str) -> str:
        """Set: line numbers answered (in the output or the error lines, once each)."""
        return f"{self.home.prefix}obatch:{batch_id}:done"

    def obatch_out(self, batch_id: str) -> str:
        """List: a batch's output lines so far; renamed to its output file's lines at the end."""
        return f"{self.home.prefix}obatch:{batch_id}:out"

    def obatch_err(self, batch_id: str) -> str:
        """List: a batch's error lines so far; renamed to its error file's lines at the end."""
        return f"{self.home.prefix}obatch:{batch_id}:err"

    def batches_of(self, owner: str) -> str:
        """Sorted set: the batch ids one owner made, by creation (ms)."""
        return f"{self.home.prefix}idx:obatches:{owner}"

    @property
    def batches_active(self) -> str:
        """Sorted set: batches not yet ended, by creation (ms): the sweep advances them."""
        return f"{self.home.prefix}idx:obatchlive"

    def a2a_task(self, task_id: str) -> str:
        """Hash: one A2A task (its agent, run, session, the task object as JSON, state,
        last update); runs.retentionHours from its last write."""
        return f"{self.home.prefix}a2a:task:{task_id}"

    def a2a_tasks(self, agent_id: str) -> str:
        """Zset: one agent's A2A task ids by last update (ListTasks); runs.retentionHours."""
        return f"{self.home.prefix}a2a:tasks:{agent_id}"

    def a2a_push(self, task_id: str) -> str:
        """Hash: one A2A task's push-notification configs (config id -> who set it and the
        config); runs.retentionHours from its last write."""
        return f"{self.home.prefix}a2a:push:{task_id}"

    def api_token(self, token_id: str) -> str:
        """Hash: one scoped api token (sha256 of its secret, agent, session, tools, label,
        created, last used, expiry); expires with the token (`--ttl`), deleted on revoke."""
        return f"{self.home.prefix}tok:{token_id}"

    @property
    def api_tokens(self) -> str:
        """Sorted set: scoped token ids by creation time (ms); an expired one is dropped
        when a listing finds its hash gone."""
        return f"{self.home.prefix}idx:tok"

    @property
    def audit(self) -> str:
        """Stream: one entry per call made with a scoped token (token id, surface, tool,
        session key, outcome), capped ~AUDIT_MAXLEN entries."""
        return f"{self.home.prefix}audit"

    # -- maintenance (home group) ---------------------------------------------------------
    @property
    def beat_marks(self) -> str:
        """Hash: sweep name → last time it ran (ms), for health checks."""
        return f"{self.home.prefix}beat"

    @property
    def apis(self) -> str:
        """Hash: api id → JSON heartbeat (host, pid, url, seen ms), for health checks."""
        return f"{self.home.prefix}apis"

    @property
    def layout(self) -> str:
        """Hash: how the keyspace is cut (``groups``), written by the first process to
        start; every process checks it agrees before it writes anything. Under the prefix
        without its braces and in no group (``{sb}:``, one group on a cluster, and
        ``sb:`` name the same one): a process cut otherwise finds it where this one does."""
        return f"{self.prefix.replace('{', '').replace('}', '')}layout"

    @property
    def one_group_indexes(self) -> tuple[str, ...]:
        """Where a store cut into one group keeps its updatedAt index, under this prefix
        and under it as a hash tag (one group on a Redis Cluster): a store holding either
        was cut into one group, whatever recorded it (data from before `layout`)."""
        bare = self.prefix.replace("{", "").replace("}", "")
        return (f"{bare}idx:upd", "{" + bare.rstrip(":") + "}:idx:upd")
