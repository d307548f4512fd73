-- Take one of a tool server's slots for a call, unless `limit` calls hold one. Leases that
-- lapsed (their worker died or lost the store) are dropped first, so their slots come back.
-- A holder that already holds a slot keeps it (its lease pushed on). Leases are on the
-- server's clock. Answers {1, holders} when taken, {0, holders} when every slot is held.
-- KEYS: slots
-- ARGV: holder limit lease_ms
-- @include tool_slot_clock
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == false and held >= tonumber(ARGV[2]) then
  return {0, held}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
keep_until_last_lease(KEYS[1], now)
return {1, redis.call('ZCARD', KEYS[1])}
