-- Take the members of a due index whose time has come (at most `limit`) and push each
-- one's next look `recheck_ms` on, so one sweep wins and a lost one comes back later:
-- the pending flow steps presumed lost, the deliveries whose step is due, and the
-- sub-agent sessions due for archive.
-- KEYS: due
-- ARGV: now limit recheck_ms
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local later = tonumber(ARGV[1]) + tonumber(ARGV[3])
for _, member in ipairs(due) do redis.call('ZADD', KEYS[1], later, member) end
return due
