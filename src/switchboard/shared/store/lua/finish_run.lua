-- End a run: append its messages, write the outcome, hand the lane to the next run, and
-- wake waiters. Guarded by (status running, attempt) so a stale worker is a no-op.
-- A run with an `onEnd` follow-up is put in the outbox in the same step, so the
-- follow-up survives a worker that dies right after this script.
-- The ended run's hash is answered, and published on `channel` (as JSON {runId, run})
-- when someone waits for it (field `watch`, see watch_run.lua), so neither the worker nor
-- a waiting api reads it again; an end nobody waits for costs no message. With channel
-- '' nothing is published (the caller publishes after its WAIT for replicas). An event
-- (event_type and JSON event_data, '' for none) is added to the events stream.
-- The session hash as the step left it is answered (the caller's copy of the transcript
-- goes on from its sessionId and seq: store/windows.py); with read_follow_up '1', the
-- `follow_up` hash (what the run's follow-up step reads first) too, so the step reads
-- neither again.
-- The lane handoff names the next run only as a value (LPOP of the lane queue): its
-- hash is not touched here, so no key is learnt inside the script.
-- A cancel request for the run (`cancels`, see cancel_run.lua) is done with once it
-- ends, however it ends: it is removed in this step, so no reader sees an ended run
-- still asked to stop. Only a run stamped `cancelRequested` was asked, and only one
-- stamped `waited` has waiters (park_run.lua, wait_on_run.lua): the others' cancel
-- request and waiters are not looked for.
-- The run and the session are each read once and written once (includes/hash_buffer.lua).
-- Steering (steer_push.lua): only a session whose `steerQueued` is set, or a run that
-- took steered messages, has the steer inbox looked at. An end with its messages (status ok) removes the `steer_taken` messages
-- the run took from the inbox (they are among its messages); when more are waiting, the
-- turn is not over: its messages are appended, nothing else is written, and the answer is
-- {'steered', the waiting messages, session hash}: the worker goes on with them. Any other
-- end leaves the inbox to the session's next turn.
-- Answers {'ok', next run id or '', run hash, session hash, follow-up hash, waiters...},
-- {'steered', messages, session hash} or {'stale'}.
-- KEYS: run lane lane_queue leases session transcript idx_all idx_agent idx_kind waiters outbox events follow_up cancels steer
-- ARGV: run_id session_key now attempt run_fields session_fields session_incr retention_s lease_at_ms channel event_type event_data events_cap read_follow_up steer_taken *messages
-- @include hash_buffer
-- @include transcript_append
-- @include touch
-- @include lane_handoff
local lane, waiters_key = KEYS[2], KEYS[10]
local run_id, session_key, now = ARGV[1], ARGV[2], ARGV[3]
local run = hash_open(KEYS[1])
local r = run.f
if r.status ~= 'running' or r.attempt ~= ARGV[4] then return {'stale'} end
local s = hash_open(KEYS[5])
for i = 16, #ARGV do append_in(s, KEYS[6], ARGV[i]) end
local fields = ARGV[5] ~= '' and cjson.decode(ARGV[5]) or {}
if s.f.steerQueued or ARGV[15] ~= '0' then
  local taken = fields.status == 'ok' and tonumber(ARGV[15]) or 0
  if taken > 0 then redis.call('LTRIM', KEYS[15], taken, -1) end
  local left = redis.call('LRANGE', KEYS[15], 0, -1)
  if #left > 0 then hash_set(s, 'steerQueued', int_text(#left)) else hash_del(s, 'steerQueued') end
  if #left > 0 and fields.status == 'ok' then
    hash_flush(s)
    return {'steered', left, hash_flat(s)}
  end
end
hash_update(run, fields)
hash_set(run, 'endedAt', now)
if ARGV[6] ~= '' then hash_update(s, cjson.decode(ARGV[6])) end
if ARGV[7] ~= '' then
  for k, v in pairs(cjson.decode(ARGV[7])) do
    hash_set(s, k, int_text((tonumber(s.f[k]) or 0) + tonumber(v)))
  end
end
touch_in(s, KEYS[7], KEYS[8], KEYS[9], session_key, now)
hash_flush(run)
hash_flush(s)
redis.call('EXPIRE', KEYS[1], ARGV[8])
if r.cancelRequested then redis.call('ZREM', KEYS[14], run_id) end
if r.onEnd then redis.call('ZADD', KEYS[11], now, run_id) end
local nxt = ''
if redis.call('GET', lane) == run_id then
  nxt = lane_handoff(lane, KEYS[3], KEYS[4], session_key, ARGV[9])
end
local waiters = {}
if r.waited then
  waiters = redis.call('SMEMBERS', waiters_key)
  redis.call('EXPIRE', waiters_key, ARGV[8])
end
if r.watch == '1' and ARGV[10] ~= '' then
  redis.call('PUBLISH', ARGV[10], cjson.encode({runId = run_id, run = r}))
end
if ARGV[11] ~= '' then
  redis.call('XADD', KEYS[12], 'MAXLEN', '~', ARGV[13], '*', 'type', ARGV[11], 'data', ARGV[12])
end
local out = {'ok', nxt, hash_flat(run), hash_flat(s), {}}
if ARGV[14] ~= '' then out[5] = redis.call('HGETALL', KEYS[13]) end
for _, w in ipairs(waiters) do table.insert(out, w) end
return out
