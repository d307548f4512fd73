-- Put a run whose worker vanished back where it can be taken again: a run resumed from
-- parked goes back to parked (its resume runs again, with the calls it parked on, so its
-- turn is written once), any other back to queued (claimed again, run from its start).
-- Answers 'queued', 'parked', 'moved' (another attempt runs it), 'renewed' (its lane's
-- lease was pushed on since the caller saw it lapse: a concurrent sweep requeued it, or a
-- worker claimed it again) or 'not-running' (it is not running: a concurrent sweep or
-- hand-back requeued it already, or it ended; never 'queued' or 'parked', which say this
-- call put it back).
-- KEYS: run leases parked
-- ARGV: attempt session_key lapsed_by_ms run_id now_ms
--   (attempt: the attempt expected to be running; '' = any. session_key, lapsed_by_ms:
--   requeue only if that lane's lease is at most lapsed_by_ms; '' = no lease check.
--   A run put back to parked is due for its resume check at now_ms.)
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'running' then return 'not-running' end
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return 'moved' end
if ARGV[2] ~= '' then
  local lease = redis.call('ZSCORE', KEYS[2], ARGV[2])
  if lease and tonumber(lease) > tonumber(ARGV[3]) then return 'renewed' end
end
local parked = redis.call('HGET', KEYS[1], 'parked')
if parked and parked ~= '' and parked ~= '[]' then
  redis.call('HSET', KEYS[1], 'status', 'parked')
  redis.call('HINCRBY', KEYS[1], 'tries', 1)  -- a try lost (its resume checks the cap)
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
  return 'parked'
end
redis.call('HSET', KEYS[1], 'status', 'queued')
return 'queued'
