-- Register a parked run as a waiter on a run of another slot group than its own (as
-- park_run.lua does for the targets of its own group, stamping it `waited`): only while
-- that run has not ended.
-- Answers 1 when registered (the run is pending), 0 when it had ended (or is unknown).
-- KEYS: run waiters
-- ARGV: waiter
local st = redis.call('HGET', KEYS[1], 'status')
if st == 'queued' or st == 'running' or st == 'parked' then
  redis.call('SADD', KEYS[2], ARGV[1])
  redis.call('HSET', KEYS[1], 'waited', '1')
  return 1
end
return 0
