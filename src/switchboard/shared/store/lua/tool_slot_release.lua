-- Give a call's tool-server slot back (and drop lapsed leases while here). Answers 1 when
-- the holder held a slot, 0 when its lease had lapsed and was dropped already.
-- KEYS: slots
-- ARGV: holder
-- @include tool_slot_clock
local gone = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
return gone
