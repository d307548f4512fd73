-- Create a pending delivery unless its id exists, index it for its session and put it
-- in the due index at `lost_at` (when its first step is presumed lost); answers 1 when
-- created, 0 when it existed.
-- KEYS: delivery session_index due
-- ARGV: fields id now keep_s prune_before lost_at
-- @include set_fields
-- @include delivery_index
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
set_fields(KEYS[1], ARGV[1])
index_delivery(KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[2])
return 1
