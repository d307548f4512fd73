-- Push forward the lane leases of the runs a worker executes, each only while that run
-- still holds its session's lane, is running, and is at the attempt the worker claimed
-- (or resumed) it as. A worker cut off from the store for longer than its lease must not
-- renew, once it is back, a lease the run's next attempt (or the lane's next run) now
-- holds: if that attempt's worker vanished in turn, the sweep would never take the lane
-- back while the stale worker lived. A lease no longer in the index (the sweep took it) is
-- not recreated. Answers the 1-based positions of the entries refused (none: {}).
-- KEYS: leases *held
--   (held: a lane key and a run key per entry)
-- ARGV: until_ms *entries
--   (entries: a session key, a run id and an attempt per entry)
local refused = {}
local n = (#KEYS - 1) / 2
for i = 1, n do
  local lane, run = KEYS[2 * i], KEYS[2 * i + 1]
  local session_key, run_id, attempt = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local st = redis.call('HMGET', run, 'status', 'attempt')
  if redis.call('GET', lane) == run_id and st[1] == 'running' and st[2] == attempt then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], session_key)
  else
    table.insert(refused, i)
  end
end
return refused
