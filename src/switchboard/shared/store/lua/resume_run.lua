-- Move a parked run back to running for its resume step (only one resume wins). The
-- attempt number moves on (it fences the writes of a stale worker) but a resume is no
-- new try: tries count the claims and the worker losses of resumed runs (claim_run,
-- requeue_run), and a run past max_attempts tries ends lost.
-- Answers {'ok', attempt, deadline, session hash[, last `history` messages, newest
-- first]}, {'exhausted', attempt, deadline} or {'skip', ''}.
-- KEYS: run parked leases session transcript
-- ARGV: run_id session_key lease_at_ms max_attempts history
if redis.call('HGET', KEYS[1], 'status') ~= 'parked' then return {'skip', ''} end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HSET', KEYS[1], 'status', 'running')
redis.call('ZREM', KEYS[2], ARGV[1])
local deadline = redis.call('HGET', KEYS[1], 'deadlineAt') or '0'
local tries = tonumber(redis.call('HGET', KEYS[1], 'tries') or '0')
if tries > tonumber(ARGV[4]) then return {'exhausted', tostring(attempt), deadline} end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
local out = {'ok', tostring(attempt), deadline, redis.call('HGETALL', KEYS[4])}
if tonumber(ARGV[5]) > 0 then
  out[5] = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', ARGV[5])
end
return out
