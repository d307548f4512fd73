-- Release a lane whose holder has ended or vanished, handing it to the next queued run
-- (answered; '' when the lane is freed or was not held by `holder`).
-- KEYS: lane lane_queue leases
-- ARGV: holder session_key lease_at_ms
-- @include lane_handoff
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return '' end
return lane_handoff(KEYS[1], KEYS[2], KEYS[3], ARGV[2], ARGV[3])
