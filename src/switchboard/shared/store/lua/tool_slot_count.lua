-- How many calls hold a tool server's slot under a lease that has not lapsed (read only).
-- KEYS: slots
-- @include tool_slot_clock
return redis.call('ZCOUNT', KEYS[1], '(' .. now_ms(), '+inf')
