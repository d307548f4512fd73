-- Start an attempt: only a pending delivery that is due (within `slack_ms`), or one
-- whose sender lost its lease. The due index then points at the lease's end (the sender
-- is presumed dead after it). Answers {verdict, value}: ok/attempt, early/due ms, busy,
-- done/status, missing.
-- KEYS: delivery due
-- ARGV: now lease_until slack_ms id
local st = redis.call('HGET', KEYS[1], 'status')
if not st then
  redis.call('ZREM', KEYS[2], ARGV[4])
  return {'missing', ''}
end
local now = tonumber(ARGV[1])
if st == 'pending' then
  local due = tonumber(redis.call('HGET', KEYS[1], 'nextAttemptAt') or '0')
  if due > now + tonumber(ARGV[3]) then
    redis.call('ZADD', KEYS[2], 'LT', due, ARGV[4])
    return {'early', tostring(due)}
  end
elseif st == 'sending' then
  local lease = tonumber(redis.call('HGET', KEYS[1], 'leaseUntil') or '0')
  if lease > now then return {'busy', ''} end
else
  redis.call('ZREM', KEYS[2], ARGV[4])
  return {'done', st}
end
local n = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('HSET', KEYS[1], 'status', 'sending', 'leaseUntil', ARGV[2], 'updatedAt', ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[4])
return {'ok', tostring(n)}
