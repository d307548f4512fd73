-- End a run: append its messages, write the outcome, hand the lane to the next run, and
-- wake waiters. Guarded by (status running, attempt) so a stale worker is a no-op.
-- A run with an `onEnd` follow-up is put in the outbox in the same step, so the
-- follow-up survives a worker that dies right after this script.
-- The end is counted by status, with the run's duration since its first claim (metrics).
-- The ended run's hash is answered, and published on `channel` (as JSON {runId, run})
-- when someone waits for it (field `watch`, see watch_run.lua), so neither the worker nor
-- a waiting api reads it again; an end nobody waits for costs no message. With channel
-- '' nothing is published (the caller publishes after its WAIT for replicas). An event
-- (event_type and JSON event_data, '' for none) is added to the events stream.
-- With read_follow_up '1', the session hash and the `follow_up` hash (what the run's
-- follow-up step reads first) are answered too, so the step reads neither again.
-- The lane handoff names the next run only as a value (LPOP of the lane queue): its
-- hash is not touched here, so no key is learnt inside the script.
-- A cancel request for the run (`cancels`, see cancel_run.lua) is done with once it
-- ends, however it ends: it is removed in this step, so no reader sees an ended run
-- still asked to stop.
-- Answers {'ok', next run id or '', run hash, session hash, follow-up hash, waiters...}
-- or {'stale'}.
-- KEYS: run lane lane_queue leases active session transcript idx_all idx_agent idx_kind waiters outbox metrics events follow_up cancels
-- ARGV: run_id session_key now attempt run_fields session_fields session_incr retention_s lease_at_ms channel event_type event_data events_cap read_follow_up *messages
-- @include set_fields
-- @include incr_fields
-- @include transcript_append
-- @include touch
-- @include run_metrics
-- @include lane_handoff
local run, lane, session, waiters_key = KEYS[1], KEYS[2], KEYS[6], KEYS[11]
local run_id, session_key, now = ARGV[1], ARGV[2], ARGV[3]
local st = redis.call('HGET', run, 'status')
local att = redis.call('HGET', run, 'attempt')
if st ~= 'running' or att ~= ARGV[4] then return {'stale'} end
for i = 15, #ARGV do transcript_append(session, KEYS[7], ARGV[i]) end
set_fields(run, ARGV[5])
redis.call('HSET', run, 'endedAt', now)
local ended = redis.call('HMGET', run, 'status', 'startedAt')
count_run_end(KEYS[13], ended[1], ended[2], now)
set_fields(session, ARGV[6])
incr_fields(session, ARGV[7])
touch(session, KEYS[8], KEYS[9], KEYS[10], session_key, now)
redis.call('EXPIRE', run, ARGV[8])
redis.call('ZREM', KEYS[5], run_id)
redis.call('ZREM', KEYS[16], run_id)
if redis.call('HEXISTS', run, 'onEnd') == 1 then
  redis.call('ZADD', KEYS[12], now, run_id)
end
local nxt = ''
if redis.call('GET', lane) == run_id then
  nxt = lane_handoff(lane, KEYS[3], KEYS[4], session_key, ARGV[9])
end
local waiters = redis.call('SMEMBERS', waiters_key)
redis.call('EXPIRE', waiters_key, ARGV[8])
local flat = redis.call('HGETALL', run)
local fields = {}
for i = 1, #flat, 2 do fields[flat[i]] = flat[i + 1] end
if fields['watch'] == '1' and ARGV[10] ~= '' then
  redis.call('PUBLISH', ARGV[10], cjson.encode({runId = run_id, run = fields}))
end
if ARGV[11] ~= '' then
  redis.call('XADD', KEYS[14], 'MAXLEN', '~', ARGV[13], '*', 'type', ARGV[11], 'data', ARGV[12])
end
local out = {'ok', nxt, flat, {}, {}}
if ARGV[14] ~= '' then
  out[4] = redis.call('HGETALL', session)
  out[5] = redis.call('HGETALL', KEYS[15])
end
for _, w in ipairs(waiters) do table.insert(out, w) end
return out
