-- Advance a reply-back flow that is still where the caller saw it (a `LinkAdvance`:
-- status, and turn unless ''), counting its outcome when it has one; answers 1 when
-- advanced, 0 when the flow has moved on.
-- KEYS: flow metrics
-- ARGV: status turn fields ttl_s counted
-- @include link_advance
if not link_advance(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 0 end
if ARGV[5] ~= '' then redis.call('HINCRBY', KEYS[2], ARGV[5], 1) end
return 1
