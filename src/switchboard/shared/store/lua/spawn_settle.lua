-- As spawn_cas, adding one to the `metric` field of the metrics hash when it moves.
-- KEYS: record metrics
-- ARGV: field expected new metric
-- @include spawn_move_field
if not move_field(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
redis.call('HINCRBY', KEYS[2], ARGV[4], 1)
return 1
