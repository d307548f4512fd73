-- claim_run(k, a[, held]): claim a run for execution; it must be in status a.expect and
-- hold its lane. On the first claim, append the run's user message to the transcript
-- (exactly once). A successful claim adds the run.started event to the events stream in
-- the same step. The session is not touched (its updatedAt and indexes): the run's start
-- touched it as the message arrived, and its end touches it again.
-- The run and its session are each read once and written once (includes/hash_buffer.lua).
-- held: a step that recorded the run and took its lane just now (start_run.lua) passes
-- {run = the run's buffer, session = the session's buffer}: neither hash, nor the lane,
-- is read again and the lease just set is not set again; it writes both buffers itself.
-- Answers what the run needs to start, so the worker makes no other read:
-- {'ok', attempt, deadline, run hash, session hash[, last a.history messages, newest
-- first[, after_seq]]}; {'exhausted', attempt, '', run hash} (claimed a.max_attempts
-- times already); or {reason, detail}
-- ('missing', 'session' with the owning session key, 'skip' with the status,
-- 'not_holder').
-- History read incrementally (store/windows.py): given the window the caller holds
-- (a.after_sid, a.after_seq; '' = none), when the session still has that sessionId and
-- its counter has reached after_seq, only the messages after after_seq are answered (at
-- most a.history, newest first) and after_seq follows them; else the last a.history.
-- When the only messages in that range are the one this claim appended (the window was
-- up to date, or the transcript was empty), they are answered without reading the
-- transcript.
-- k: run lane leases session transcript events notices
-- a: run_id session_key now lease_at_ms expect max_attempts timeout_ms (when the run has
--    no timeoutS of its own) history events_cap after_sid after_seq
-- @include hash_buffer
-- @include transcript_append
-- @include run_event
local function claim_history(k, a, s, before, appended)
  local from, up_to_date = '-', before == 0
  local out_seq = nil
  if a.after_sid ~= '' and s.f.sessionId == a.after_sid
      and (tonumber(s.f.seq) or 0) >= tonumber(a.after_seq) then
    from = '(' .. a.after_seq .. '-0'
    out_seq = a.after_seq
    up_to_date = before == tonumber(a.after_seq)
  end
  if up_to_date then return appended, out_seq end
  return redis.call('XREVRANGE', k.transcript, '+', from, 'COUNT', a.history), out_seq
end
local function claim_event(k, a, r, attempt)
  -- The run.started event, in the same step (data as `events.run_event` shapes it).
  local ev = {runId = a.run_id, sessionKey = a.session_key, kind = r.kind or 'agent',
    attempt = attempt, ts = tonumber(a.now)}
  redis.call('XADD', k.events, 'MAXLEN', '~', a.events_cap, '*', 'type', 'run.started',
    'data', run_event_data(ev, r.meta))
end
local function claim_run(k, a, held)
  local run = held and held.run or hash_open(k.run)
  local r = run.f
  local st = r.status
  if not st then return {'missing', ''} end
  local owner = r.sessionKey
  if owner and owner ~= a.session_key then return {'session', owner} end
  if st ~= a.expect then return {'skip', st} end
  if not held then
    local holder = redis.call('GET', k.lane)
    if holder ~= a.run_id then return {'not_holder', holder or ''} end
  end
  local attempt = (tonumber(r.attempt) or 0) + 1
  -- Tries count the claims (each executes the run from its start); `attempt` also
  -- counts resumes, which fence a stale worker's writes but are no new try.
  local tries = (tonumber(r.tries) or 0) + 1
  hash_set(run, 'attempt', int_text(attempt))
  hash_set(run, 'tries', int_text(tries))
  hash_set(run, 'status', 'running')
  if tries > tonumber(a.max_attempts) then
    hash_flush(run)
    return {'exhausted', int_text(attempt), '', hash_flat(run)}
  end
  local deadline = r.deadlineAt
  if not deadline then
    local timeout_ms = r.timeoutS and math.floor(tonumber(r.timeoutS) * 1000)
      or tonumber(a.timeout_ms)
    deadline = tostring(tonumber(a.now) + timeout_ms)
    hash_set(run, 'startedAt', a.now)
    hash_set(run, 'deadlineAt', deadline)
  end
  if not held then redis.call('ZADD', k.leases, a.lease_at_ms, a.session_key) end
  local s = held and held.session or hash_open(k.session)
  hash_set(s, 'status', 'running')
  hash_set(s, 'lastRunId', a.run_id)
  local before = tonumber(s.f.seq) or 0
  local appended = {}  -- newest first
  if not r.userSeq then
    if (tonumber(s.f.noticesQueued) or 0) > 0 then
      -- Notifications left for this turn (notice_push.lua) go first, once.
      for _, m in ipairs(redis.call('LRANGE', k.notices, 0, -1)) do
        local seq = append_in(s, k.transcript, m)
        table.insert(appended, 1, {int_text(seq) .. '-0', {'m', m}})
      end
      redis.call('DEL', k.notices)
      hash_del(s, 'noticesQueued')
    end
    local msg = r.message
    if msg then
      local seq = append_in(s, k.transcript, msg)
      hash_set(run, 'userSeq', int_text(seq))
      table.insert(appended, 1, {int_text(seq) .. '-0', {'m', msg}})
    end
  end
  hash_flush(run)
  hash_flush(s)
  claim_event(k, a, r, attempt)
  local out = {'ok', int_text(attempt), deadline, hash_flat(run), hash_flat(s)}
  if tonumber(a.history) > 0 then
    out[6], out[7] = claim_history(k, a, s, before, appended)
  end
  return out
end
