-- Cancel a run (`subagents cancel`). A queued or parked run ends here as `cancelled`, as
-- finish_run.lua ends one: outcome, out of its lane's queue (or the lane handed on), out of
-- the parked set, the outbox for its follow-up, waiters, the run-ended publish (when
-- watched) and the run.ended event. A running run is only asked to stop: the
-- request is stamped on its hash (`cancelRequested`) and added to `cancels`, where the
-- worker executing it looks (runtime/leases.py); requests older than `stale_before` are
-- dropped from `cancels` (their runs ended meanwhile or are stamped on their hashes).
-- Answers {'cancelled', next run id or '', run hash, waiters...}, {'requested'},
-- {'ended', status} or {'missing'}.
-- KEYS: run lane lane_queue leases parked session waiters outbox events cancels
-- ARGV: run_id session_key now retention_s lease_at_ms channel error events_cap stale_before
-- @include lane_handoff
-- @include run_event
local run = KEYS[1]
local run_id, session_key, now = ARGV[1], ARGV[2], ARGV[3]
local st = redis.call('HGET', run, 'status')
if not st then return {'missing'} end
if st ~= 'queued' and st ~= 'running' and st ~= 'parked' then return {'ended', st} end
if st == 'running' then
  if not redis.call('HGET', run, 'cancelRequested') then
    redis.call('HSET', run, 'cancelRequested', now)
  end
  redis.call('ZADD', KEYS[10], now, run_id)
  redis.call('ZREMRANGEBYSCORE', KEYS[10], '-inf', '(' .. ARGV[9])
  return {'requested'}
end
redis.call('HSET', run, 'status', 'cancelled', 'error', ARGV[7], 'endedAt', now,
  'cancelRequested', now)
redis.call('HDEL', run, 'parked', 'attachments')
redis.call('EXPIRE', run, ARGV[4])
redis.call('LREM', KEYS[3], 0, run_id)
redis.call('ZREM', KEYS[5], run_id)
if redis.call('HEXISTS', run, 'onEnd') == 1 then
  redis.call('ZADD', KEYS[8], now, run_id)
end
local nxt = ''
if redis.call('GET', KEYS[2]) == run_id then
  nxt = lane_handoff(KEYS[2], KEYS[3], KEYS[4], session_key, ARGV[5])
  redis.call('HSET', KEYS[6], 'status', 'cancelled', 'abortedLastRun', '1')
end
local flat = redis.call('HGETALL', run)
local fields = {}
for i = 1, #flat, 2 do fields[flat[i]] = flat[i + 1] end
local waiters = {}
if fields['waited'] then  -- only a run stamped `waited` has waiters (park_run.lua)
  waiters = redis.call('SMEMBERS', KEYS[7])
  redis.call('EXPIRE', KEYS[7], ARGV[4])
end
if fields['watch'] == '1' then
  redis.call('PUBLISH', ARGV[6], cjson.encode({runId = run_id, run = fields}))
end
-- The run.ended event (data as `events.run_event` shapes it).
local ev = {runId = run_id, sessionKey = session_key, kind = fields['kind'] or 'agent',
  status = 'cancelled', error = ARGV[7], ts = tonumber(now)}
redis.call('XADD', KEYS[9], 'MAXLEN', '~', ARGV[8], '*', 'type', 'run.ended',
  'data', run_event_data(ev, fields['meta']))
local out = {'cancelled', nxt, flat}
for _, w in ipairs(waiters) do table.insert(out, w) end
return out
