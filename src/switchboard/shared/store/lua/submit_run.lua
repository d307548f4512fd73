-- Record a new run (its JSON fields) and take the session lane (1), or queue behind the
-- holder (0).
-- KEYS: run lane lane_queue leases
-- ARGV: run_id session_key lease_at_ms run_fields
-- @include set_fields
set_fields(KEYS[1], ARGV[4])
if redis.call('SET', KEYS[2], ARGV[1], 'NX') then
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[2])
  return 1
end
redis.call('RPUSH', KEYS[3], ARGV[1])
return 0
