-- Push a held tool-server slot's lease on, only while its lease has not lapsed: a lapsed
-- one may already be another call's slot, and is not taken back. Answers 1 when renewed,
-- 0 when the holder no longer holds a slot.
-- KEYS: slots
-- ARGV: holder lease_ms
-- @include tool_slot_clock
local now = now_ms()
local until_ms = redis.call('ZSCORE', KEYS[1], ARGV[1])
if until_ms == false or tonumber(until_ms) <= now then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
keep_until_last_lease(KEYS[1], now)
return 1
