-- claim_run(k, a): claim a run for execution; it must be in status a.expect and hold its
-- lane. On the first claim, append the run's user message to the transcript (exactly
-- once), touch the session and count the run as started (metrics). A successful claim
-- adds the run.started event to the events stream in the same step.
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
-- k: run lane leases active session transcript idx_all idx_agent idx_kind metrics events
-- a: run_id session_key now lease_at_ms expect max_attempts timeout_ms (when the run has
--    no timeoutS of its own) history events_cap after_sid after_seq
-- @include transcript_append
-- @include touch
-- @include run_metrics
local function claim_run(k, a)
  local st = redis.call('HGET', k.run, 'status')
  if not st then return {'missing', ''} end
  local owner = redis.call('HGET', k.run, 'sessionKey')
  if owner and owner ~= a.session_key then return {'session', owner} end
  if st ~= a.expect then return {'skip', st} end
  local holder = redis.call('GET', k.lane)
  if holder ~= a.run_id then return {'not_holder', holder or ''} end
  local attempt = redis.call('HINCRBY', k.run, 'attempt', 1)
  -- Tries count the claims (each executes the run from its start); `attempt` also
  -- counts resumes, which fence a stale worker's writes but are no new try.
  local tries = redis.call('HINCRBY', k.run, 'tries', 1)
  redis.call('HSET', k.run, 'status', 'running')
  if tries > tonumber(a.max_attempts) then
    return {'exhausted', tostring(attempt), '', redis.call('HGETALL', k.run)}
  end
  local deadline = redis.call('HGET', k.run, 'deadlineAt')
  if not deadline then
    local timeout_s = redis.call('HGET', k.run, 'timeoutS')
    local timeout_ms = timeout_s and math.floor(tonumber(timeout_s) * 1000)
      or tonumber(a.timeout_ms)
    deadline = tostring(tonumber(a.now) + timeout_ms)
    redis.call('HSET', k.run, 'startedAt', a.now, 'deadlineAt', deadline)
    count_run_start(k.metrics)
  end
  redis.call('ZADD', k.active, deadline, a.run_id)
  redis.call('ZADD', k.leases, a.lease_at_ms, a.session_key)
  redis.call('HSET', k.session, 'status', 'running', 'lastRunId', a.run_id)
  if not redis.call('HGET', k.run, 'userSeq') then
    local msg = redis.call('HGET', k.run, 'message')
    if msg then
      local seq = transcript_append(k.session, k.transcript, msg)
      redis.call('HSET', k.run, 'userSeq', seq)
    end
    touch(k.session, k.idx_all, k.idx_agent, k.idx_kind, a.session_key, a.now)
  end
  -- The run.started event, in the same step (data as `events.run_event` shapes it).
  local f = redis.call('HMGET', k.run, 'kind', 'meta')
  local ev = {runId = a.run_id, sessionKey = a.session_key, kind = f[1] or 'agent',
    attempt = attempt, ts = tonumber(a.now)}
  if f[2] then
    local ok, meta = pcall(cjson.decode, f[2])
    if ok and type(meta) == 'table' then
      for _, name in ipairs({'flowId', 'spawnId', 'batchId'}) do
        local v = meta[name]
        if v and v ~= cjson.null and v ~= '' and v ~= false then ev[name] = v end
      end
    end
  end
  redis.call('XADD', k.events, 'MAXLEN', '~', a.events_cap, '*', 'type', 'run.started',
    'data', cjson.encode(ev))
  local out = {'ok', tostring(attempt), deadline, redis.call('HGETALL', k.run)}
  out[5] = redis.call('HGETALL', k.session)
  if tonumber(a.history) > 0 then
    local from, held = '-', nil
    if a.after_sid ~= '' then held = redis.call('HMGET', k.session, 'sessionId', 'seq') end
    if held and held[1] == a.after_sid and tonumber(held[2] or 0) >= tonumber(a.after_seq) then
      from = '(' .. a.after_seq .. '-0'
      out[7] = a.after_seq
    end
    out[6] = redis.call('XREVRANGE', k.transcript, '+', from, 'COUNT', a.history)
  end
  return out
end
