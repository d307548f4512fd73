-- lane_handoff(lane, lane_queue, leases, session_key, lease_at_ms): the lane's holder is
-- done: hand the lane to the next queued run (its lease until lease_at_ms) and answer its
-- id, or free the lane and answer ''. The caller checks who holds the lane first. Only
-- the lane's keys are touched: the next run's hash is read by whoever claims it.
local function lane_handoff(lane, lane_queue, leases, session_key, lease_at_ms)
  local n = redis.call('LPOP', lane_queue)
  if n then
    redis.call('SET', lane, n)
    redis.call('ZADD', leases, lease_at_ms, session_key)
    return n
  end
  redis.call('DEL', lane)
  redis.call('ZREM', leases, session_key)
  return ''
end
