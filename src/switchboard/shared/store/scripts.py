"""Lua scripts for the read-decide-write steps that must be atomic across workers.

Each script is short and touches only keys passed in KEYS. Common pieces (appending a
message with the next sequence number, touching a session's indexes) are prepended as
local functions.
"""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.commands.core import Script

from switchboard.shared.metrics import LUA_RUN_METRICS

# Lua: set the fields of a JSON object of text values on a hash (null deletes a field).
LUA_SET_FIELDS = """
local function set_fields(key, json)
  if json == '' then return end
  local set, gone = {}, {}
  for k, v in pairs(cjson.decode(json)) do
    if v == cjson.null then gone[#gone + 1] = k else set[#set + 1] = k; set[#set + 1] = v end
  end
  if #set > 0 then redis.call('HSET', key, unpack(set)) end
  if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
end
"""

# Lua: a compare-and-set on a hash (`LinkAdvance`): unless its `status` is still
# `status` (and its `turn` is `turn`, '' = any), false; else write the JSON fields (null
# deletes one), keep the hash ttl_s, true.
LUA_LINK_ADVANCE = """
local function link_advance(key, status, turn, json, ttl_s)
  if redis.call('HGET', key, 'status') ~= status then return false end
  if turn ~= '' and redis.call('HGET', key, 'turn') ~= turn then return false end
  set_fields(key, json)
  redis.call('EXPIRE', key, ttl_s)
  return true
end
"""

# A `LinkAdvance` on its own. KEYS: hash. ARGV: status, turn, JSON fields, TTL s.
# Answers 1 when made, 0 when the hash has moved on.
ADVANCE_LINK = (
    LUA_SET_FIELDS
    + LUA_LINK_ADVANCE
    + "if link_advance(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 1 end\n"
    + "return 0\n"
)

_COMMON = (
    LUA_SET_FIELDS
    + LUA_LINK_ADVANCE
    + """
-- A new session entry (sessionId, createdAt, seq 0, its first fields) unless it exists: 1 if made.
local function create_session(session, sid_index, key, now, sid, fields)
  if redis.call('EXISTS', session) == 1 then return 0 end
  redis.call('HSET', session, 'sessionId', sid, 'createdAt', now, 'seq', 0)
  redis.call('HSET', sid_index, sid, key)
  set_fields(session, fields)
  return 1
end
local function touch(session, idx_all, idx_agent, idx_kind, member, now)
  redis.call('HSET', session, 'updatedAt', now)
  redis.call('ZADD', idx_all, now, member)
  redis.call('ZADD', idx_agent, now, member)
  redis.call('ZADD', idx_kind, now, member)
end
local function append(session, stream, msg)
  local seq = redis.call('HINCRBY', session, 'seq', 1)
  redis.call('XADD', stream, seq .. '-0', 'm', msg)
  return seq
end
local function incr_fields(key, json)
  if json == '' then return end
  for k, v in pairs(cjson.decode(json)) do
    redis.call('HINCRBY', key, k, v)
  end
end
"""
)

# Create a session entry if missing (with its sessionId and index entries), then touch it.
# KEYS: session, sid index, idx_all, idx_agent, idx_kind
# ARGV: key, now, new session id, JSON fields for a new entry, JSON fields always set
ENSURE_SESSION = (
    _COMMON
    + """
local created = create_session(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
set_fields(KEYS[1], ARGV[5])
touch(KEYS[1], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2])
return {created, redis.call('HGET', KEYS[1], 'sessionId')}
"""
)

# Record a new run and take the session lane, or queue behind the holder.
# KEYS: run, lane, lane queue, leases
# ARGV: run id, session key, lease expiry ms, JSON run fields
SUBMIT_RUN = (
    _COMMON
    + """
set_fields(KEYS[1], ARGV[4])
if redis.call('SET', KEYS[2], ARGV[1], 'NX') then
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[2])
  return 1
end
redis.call('RPUSH', KEYS[3], ARGV[1])
return 0
"""
)

# Claim a run for execution: it must be in the expected state and hold its lane.
# On the first claim, append the run's user message to the transcript (exactly once).
# The first claim counts the run as started (metrics).
# Answers what the run needs to start, so the worker makes no other read: the run hash,
# the session hash and the transcript's last messages (newest first).
# A successful claim adds the run.started event to the events stream in the same step.
# K: run, lane, leases, active, session, transcript, idx_all, idx_agent, idx_kind, metrics,
#    events stream
# A: run id, session key, now, lease expiry, expected status, max attempts,
#    default timeout ms (used when the run has no timeoutS of its own), history count,
#    events stream cap
LUA_CLAIM = """
local function claim_run(K, A)
  local st = redis.call('HGET', K[1], 'status')
  if not st then return {'missing', ''} end
  local owner = redis.call('HGET', K[1], 'sessionKey')
  if owner and owner ~= A[2] then return {'session', owner} end
  if st ~= A[5] then return {'skip', st} end
  local holder = redis.call('GET', K[2])
  if holder ~= A[1] then return {'not_holder', holder or ''} end
  local attempt = redis.call('HINCRBY', K[1], 'attempt', 1)
  redis.call('HSET', K[1], 'status', 'running')
  if attempt > tonumber(A[6]) then
    return {'exhausted', tostring(attempt), '', redis.call('HGETALL', K[1])}
  end
  local deadline = redis.call('HGET', K[1], 'deadlineAt')
  if not deadline then
    local timeout_s = redis.call('HGET', K[1], 'timeoutS')
    local timeout_ms = timeout_s and math.floor(tonumber(timeout_s) * 1000) or tonumber(A[7])
    deadline = tostring(tonumber(A[3]) + timeout_ms)
    redis.call('HSET', K[1], 'startedAt', A[3], 'deadlineAt', deadline)
    count_run_start(K[10])
  end
  redis.call('ZADD', K[4], deadline, A[1])
  redis.call('ZADD', K[3], A[4], A[2])
  redis.call('HSET', K[5], 'status', 'running', 'lastRunId', A[1])
  if not redis.call('HGET', K[1], 'userSeq') then
    local msg = redis.call('HGET', K[1], 'message')
    if msg then
      local seq = append(K[5], K[6], msg)
      redis.call('HSET', K[1], 'userSeq', seq)
    end
    touch(K[5], K[7], K[8], K[9], A[2], A[3])
  end
  -- The run.started event, in the same step (data as `events.run_event` shapes it).
  local f = redis.call('HMGET', K[1], 'kind', 'meta')
  local ev = {runId = A[1], sessionKey = A[2], kind = f[1] or 'agent',
    attempt = attempt, ts = tonumber(A[3])}
  if f[2] then
    local ok, meta = pcall(cjson.decode, f[2])
    if ok and type(meta) == 'table' then
      for _, name in ipairs({'flowId', 'spawnId', 'batchId'}) do
        local v = meta[name]
        if v and v ~= cjson.null and v ~= '' and v ~= false then ev[name] = v end
      end
    end
  end
  redis.call('XADD', K[11], 'MAXLEN', '~', A[9], '*', 'type', 'run.started',
    'data', cjson.encode(ev))
  local out = {'ok', tostring(attempt), deadline, redis.call('HGETALL', K[1])}
  out[5] = redis.call('HGETALL', K[5])
  if tonumber(A[8]) > 0 then
    out[6] = redis.call('XREVRANGE', K[6], '+', '-', 'COUNT', A[8])
  end
  return out
end
"""

# KEYS and ARGV as `claim_run` takes them (above).
CLAIM_RUN = _COMMON + LUA_RUN_METRICS + LUA_CLAIM + "return claim_run(KEYS, ARGV)\n"

# Start a run in one step: create the session entry if missing and touch it (as
# ENSURE_SESSION); map the idempotency key to the run unless it already names one (then
# record nothing); record the run and take the lane or queue behind the holder (as
# SUBMIT_RUN). With a link, name the run (or the one the idempotency key names) in a
# field of another hash unless that field is set (first writer wins): a flow's round.
# With a link record, first write that hash's fields (a new flow) and add its member to
# the record's indexes (KEYS past the 15th), trimmed, all kept for the record's TTL.
# With a history count, a run that took the lane is claimed in the same step (as
# CLAIM_RUN claims it) for the caller to execute at once: the claim's answer is the fifth
# element.
# With a link advance, first a compare-and-set on the link hash (LUA_LINK_ADVANCE): when
# the hash has moved on, nothing is written and the answer is {'moved'}.
# Answers {created, sessionId, 'lane' | 'queued' | 'duplicate', run id named by the
# idempotency key[, claim]}.
# KEYS: session, sid index, idx_all, idx_agent, idx_kind, run, lane, lane queue, leases,
#       idempotency key (any key when there is none), link hash (any key when no link),
#       active, transcript, metrics, events stream (any keys when not claiming),
#       link record indexes...
# ARGV: key, now, new session id, JSON fields for a new entry, run id, lease expiry ms,
#       JSON run fields, idempotency TTL s ('' = no idempotency key), link field ('' = none),
#       JSON link record fields ('' = no record), record TTL s, index score, index member,
#       index trim score (members at or below it go), claim's history count ('' = no
#       claim), max attempts, default timeout ms, events stream cap, link advance's
#       status ('' = no link advance), turn, JSON fields and TTL s
START_RUN = (
    _COMMON
    + LUA_RUN_METRICS
    + LUA_CLAIM
    + """
if ARGV[19] ~= '' and not link_advance(KEYS[11], ARGV[19], ARGV[20], ARGV[21], ARGV[22]) then
  return {'moved'}
end
local function link(run_id)
  if ARGV[9] ~= '' then redis.call('HSETNX', KEYS[11], ARGV[9], run_id) end
end
if ARGV[10] ~= '' then
  set_fields(KEYS[11], ARGV[10])
  redis.call('EXPIRE', KEYS[11], ARGV[11])
  for i = 16, #KEYS do
    redis.call('ZADD', KEYS[i], ARGV[12], ARGV[13])
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ARGV[14])
    redis.call('EXPIRE', KEYS[i], ARGV[11])
  end
end
local created = create_session(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
touch(KEYS[1], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2])
local sid = redis.call('HGET', KEYS[1], 'sessionId')
if ARGV[8] ~= '' and not redis.call('SET', KEYS[10], ARGV[5], 'NX', 'EX', ARGV[8]) then
  local existing = redis.call('GET', KEYS[10]) or ARGV[5]
  link(existing)
  return {created, sid, 'duplicate', existing}
end
set_fields(KEYS[6], ARGV[7])
link(ARGV[5])
if redis.call('SET', KEYS[7], ARGV[5], 'NX') then
  redis.call('ZADD', KEYS[9], ARGV[6], ARGV[1])
  if ARGV[15] ~= '' then
    local claim = claim_run(
      {KEYS[6], KEYS[7], KEYS[9], KEYS[12], KEYS[1], KEYS[13], KEYS[3], KEYS[4], KEYS[5],
       KEYS[14], KEYS[15]},
      {ARGV[5], ARGV[1], ARGV[2], ARGV[6], 'queued', ARGV[16], ARGV[17], ARGV[15], ARGV[18]})
    return {created, sid, 'lane', '', claim}
  end
  return {created, sid, 'lane', ''}
end
redis.call('RPUSH', KEYS[8], ARGV[5])
return {created, sid, 'queued', ''}
"""
)

# End a run: append its messages, write the outcome, release the lane to the next run,
# and wake waiters. Guarded by (status running, attempt) so a stale worker is a no-op.
# A run with an `onEnd` follow-up is put in the outbox in the same step, so the
# follow-up survives a worker that dies right after this script.
# The end is counted by status, with the run's duration since its first claim (metrics).
# The ended run's hash is answered, and published on the run-ended channel (as JSON
# {runId, run}) when someone waits for it (field `watch`, see WATCH_RUN), so neither the
# worker nor a waiting api reads it again; an end nobody waits for costs no message. An event
# (type and JSON data, '' for none) is added to the events stream in the same step.
# With ARGV[14] set, the session hash and one more hash (what the run's follow-up step
# reads first: its flow) are answered too, so the step reads neither again.
# Answers {'ok', next run, run hash, session hash, follow-up hash, waiters...}.
# KEYS: run, lane, lane queue, leases, active, session, transcript, idx_all, idx_agent,
#       idx_kind, waiters, outbox, metrics, events stream, follow-up hash (any key if none)
# ARGV: run id, session key, now, attempt, JSON run fields, JSON session fields,
#       JSON session increments, retention s, lease expiry for the next run, channel,
#       event type, event data, events stream cap, '1' to answer the follow-up's hashes
#       ('' not), messages...
FINISH_RUN = (
    _COMMON
    + LUA_RUN_METRICS
    + """
local st = redis.call('HGET', KEYS[1], 'status')
local att = redis.call('HGET', KEYS[1], 'attempt')
if st ~= 'running' or att ~= ARGV[4] then return {'stale'} end
for i = 15, #ARGV do append(KEYS[6], KEYS[7], ARGV[i]) end
set_fields(KEYS[1], ARGV[5])
redis.call('HSET', KEYS[1], 'endedAt', ARGV[3])
local ended = redis.call('HMGET', KEYS[1], 'status', 'startedAt')
count_run_end(KEYS[13], ended[1], ended[2], ARGV[3])
set_fields(KEYS[6], ARGV[6])
incr_fields(KEYS[6], ARGV[7])
touch(KEYS[6], KEYS[8], KEYS[9], KEYS[10], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[8])
redis.call('ZREM', KEYS[5], ARGV[1])
if redis.call('HEXISTS', KEYS[1], 'onEnd') == 1 then
  redis.call('ZADD', KEYS[12], ARGV[3], ARGV[1])
end
local nxt = ''
if redis.call('GET', KEYS[2]) == ARGV[1] then
  local n = redis.call('LPOP', KEYS[3])
  if n then
    nxt = n
    redis.call('SET', KEYS[2], n)
    redis.call('ZADD', KEYS[4], ARGV[9], ARGV[2])
  else
    redis.call('DEL', KEYS[2])
    redis.call('ZREM', KEYS[4], ARGV[2])
  end
end
local waiters = redis.call('SMEMBERS', KEYS[11])
redis.call('EXPIRE', KEYS[11], ARGV[8])
local flat = redis.call('HGETALL', KEYS[1])
local run = {}
for i = 1, #flat, 2 do run[flat[i]] = flat[i + 1] end
if run['watch'] == '1' then
  redis.call('PUBLISH', ARGV[10], cjson.encode({runId = ARGV[1], run = run}))
end
if ARGV[11] ~= '' then
  redis.call('XADD', KEYS[14], 'MAXLEN', '~', ARGV[13], '*', 'type', ARGV[11], 'data', ARGV[12])
end
local out = {'ok', nxt, flat, {}, {}}
if ARGV[14] ~= '' then
  out[4] = redis.call('HGETALL', KEYS[6])
  out[5] = redis.call('HGETALL', KEYS[15])
end
for _, w in ipairs(waiters) do table.insert(out, w) end
return out
"""
)

# Park a run on deferred tool calls: append what it said so far, keep the lane, and
# register as a waiter on every target run that has not ended. 'ready' when all ended.
# KEYS: run, session, transcript, parked index, leases, idx_all, idx_agent, idx_kind,
#       then pairs (target run, target waiters)...
# ARGV: run id, session key, now, attempt, JSON parked calls, wait deadline ms,
#       lease expiry, message count, messages...
PARK_RUN = (
    _COMMON
    + """
local st = redis.call('HGET', KEYS[1], 'status')
local att = redis.call('HGET', KEYS[1], 'attempt')
if st ~= 'running' or att ~= ARGV[4] then return 'stale' end
local n = tonumber(ARGV[8])
for i = 9, 8 + n do append(KEYS[2], KEYS[3], ARGV[i]) end
touch(KEYS[2], KEYS[6], KEYS[7], KEYS[8], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[1], 'status', 'parked', 'parked', ARGV[5])
redis.call('HSET', KEYS[2], 'status', 'parked')
local pending = 0
for i = 9, #KEYS, 2 do
  local tst = redis.call('HGET', KEYS[i], 'status')
  if tst == 'queued' or tst == 'running' or tst == 'parked' then
    redis.call('SADD', KEYS[i + 1], ARGV[1])
    pending = pending + 1
  end
end
redis.call('ZADD', KEYS[4], ARGV[6], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[7], ARGV[2])
if pending == 0 then return 'ready' end
return 'parked'
"""
)

# Move a parked run back to running for its resume step (only one resume wins).
# Answers the run's deadline, the session hash and the transcript's last messages.
# KEYS: run, parked index, leases, session, transcript
# ARGV: run id, session key, lease expiry, max attempts, history count
RESUME_RUN = """
if redis.call('HGET', KEYS[1], 'status') ~= 'parked' then return {'skip', ''} end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HSET', KEYS[1], 'status', 'running')
redis.call('ZREM', KEYS[2], ARGV[1])
local deadline = redis.call('HGET', KEYS[1], 'deadlineAt') or '0'
if attempt > tonumber(ARGV[4]) then return {'exhausted', tostring(attempt), deadline} end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
local out = {'ok', tostring(attempt), deadline, redis.call('HGETALL', KEYS[4])}
if tonumber(ARGV[5]) > 0 then
  out[5] = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', ARGV[5])
end
return out
"""

# Put a run whose worker vanished back in the queued state so it can be claimed again.
# KEYS: run; ARGV: expected attempt ('' = any)
REQUEUE_RUN = """
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'running' then return st or '' end
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return 'moved' end
redis.call('HSET', KEYS[1], 'status', 'queued')
return 'queued'
"""

# Release a lane whose holder has ended or vanished, handing it to the next queued run.
# KEYS: lane, lane queue, leases; ARGV: expected holder, session key, lease expiry
RELEASE_LANE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return '' end
local n = redis.call('LPOP', KEYS[2])
if n then
  redis.call('SET', KEYS[1], n)
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
  return n
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[2])
return ''
"""


# Mark a run as waited for (its end is then published, see FINISH_RUN) and read it:
# marked before it ends, its end is published; ended first, this read sees the outcome.
# KEYS: run; answers its HGETALL (empty when unknown: nothing is written then).
WATCH_RUN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
redis.call('HSET', KEYS[1], 'watch', '1')
return redis.call('HGETALL', KEYS[1])
"""


# Read several hashes in one reply (one parse, no per-command overhead).
# KEYS: hashes; answers one flat HGETALL reply per key (empty when missing).
GET_HASHES = """
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('HGETALL', key) end
return out
"""


# The first page of the updatedAt indexes, newest first, with each listed session's hash:
# what a listing needs, in one round trip. The indexes' rows (each newest first) are
# merged by score, ties in index order then position, as `SessionStore.recent_page`
# merges them. The session hashes are named from their keys (ARGV[4] is the session key
# prefix), as the store keeps everything in one Redis.
# KEYS: indexes. ARGV: max score, min score, how many, session key prefix.
# Answers {member, score, flat HGETALL} per row, at most ARGV[3] rows.
RECENT_ENTRIES = """
local want = tonumber(ARGV[3])
local lists, at = {}, {}
for i, index in ipairs(KEYS) do
  lists[i] = redis.call('ZREVRANGEBYSCORE', index, ARGV[1], ARGV[2], 'WITHSCORES',
    'LIMIT', 0, want)
  at[i] = 1
end
local out = {}
while #out < want do
  local best, best_score = nil, nil
  for i = 1, #lists do
    if at[i] <= #lists[i] then
      local score = tonumber(lists[i][at[i] + 1])
      if best == nil or score > best_score then best, best_score = i, score end
    end
  end
  if best == nil then break end
  local rows, j = lists[best], at[best]
  out[#out + 1] = {rows[j], rows[j + 1], redis.call('HGETALL', ARGV[4] .. rows[j])}
  at[best] = j + 2
end
return out
"""


class Scripts:
    """The registered scripts of one Redis client (EVALSHA with automatic reload)."""

    def __init__(self, redis: Redis) -> None:
        self.ensure_session: Script = redis.register_script(ENSURE_SESSION)
        self.submit_run: Script = redis.register_script(SUBMIT_RUN)
        self.start_run: Script = redis.register_script(START_RUN)
        self.advance_link: Script = redis.register_script(ADVANCE_LINK)
        self.claim_run: Script = redis.register_script(CLAIM_RUN)
        self.finish_run: Script = redis.register_script(FINISH_RUN)
        self.park_run: Script = redis.register_script(PARK_RUN)
        self.resume_run: Script = redis.register_script(RESUME_RUN)
        self.requeue_run: Script = redis.register_script(REQUEUE_RUN)
        self.release_lane: Script = redis.register_script(RELEASE_LANE)
        self.get_hashes: Script = redis.register_script(GET_HASHES)
        self.recent_entries: Script = redis.register_script(RECENT_ENTRIES)


def as_text(value: Any) -> str:
    """Decode a Redis reply element (bytes or str or int) to text."""
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
