-- Park a run on deferred tool calls: append what it said so far, keep the lane, and
-- register as a waiter on every target run that has not ended (the target is stamped
-- `waited`, so its end looks for its waiters: finish_run.lua). Answers 'parked',
-- 'ready' (every target had ended) or 'stale' (guarded by status running and attempt).
-- The `steer_taken` messages the run took from its session's steer inbox (among its
-- messages: steer_push.lua) leave the inbox.
-- KEYS: run session transcript parked leases idx_all idx_agent idx_kind steer *targets
--   (targets: pairs of a target run's hash and its waiters set)
-- ARGV: run_id session_key now attempt calls deadline_ms lease_at_ms steer_taken *messages
-- @include transcript_append
-- @include touch
local run, session = KEYS[1], KEYS[2]
local st = redis.call('HGET', run, 'status')
local att = redis.call('HGET', run, 'attempt')
if st ~= 'running' or att ~= ARGV[4] then return 'stale' end
for i = 9, #ARGV do transcript_append(session, KEYS[3], ARGV[i]) end
if tonumber(ARGV[8]) > 0 then
  redis.call('LTRIM', KEYS[9], ARGV[8], -1)
  local left = redis.call('LLEN', KEYS[9])
  if left > 0 then
    redis.call('HSET', session, 'steerQueued', left)
  else
    redis.call('HDEL', session, 'steerQueued')
  end
end
touch(session, KEYS[6], KEYS[7], KEYS[8], ARGV[2], ARGV[3])
redis.call('HSET', run, 'status', 'parked', 'parked', ARGV[5])
redis.call('HSET', session, 'status', 'parked')
local pending = 0
for i = 10, #KEYS, 2 do
  local tst = redis.call('HGET', KEYS[i], 'status')
  if tst == 'queued' or tst == 'running' or tst == 'parked' then
    redis.call('SADD', KEYS[i + 1], ARGV[1])
    redis.call('HSET', KEYS[i], 'waited', '1')
    pending = pending + 1
  end
end
redis.call('ZADD', KEYS[4], ARGV[6], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[7], ARGV[2])
if pending == 0 then return 'ready' end
return 'parked'
