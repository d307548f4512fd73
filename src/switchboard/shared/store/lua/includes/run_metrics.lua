-- count_run_start(metrics) / count_run_end(metrics, status, started_at, ended_at): the
-- run counters of the metrics hash (`shared/metrics.py` names them: runs_started,
-- runs_ended:<status>, and the duration histogram run_duration_le:<ms>|+Inf (not
-- cumulative), run_duration_sum_ms, run_duration_count). The bucket bounds (ms) are
-- RUN_DURATION_BUCKETS_MS; a unit test keeps the two lists equal.
local RUN_DURATION_BUCKETS_MS = {100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
  120000, 300000, 600000, 1800000, 3600000}
local function count_run_start(metrics)
  redis.call('HINCRBY', metrics, 'runs_started', 1)
end
local function count_run_end(metrics, status, started_at, ended_at)
  redis.call('HINCRBY', metrics, 'runs_ended:' .. status, 1)
  if not started_at then return end
  local ms = math.max(0, math.floor(tonumber(ended_at) - tonumber(started_at)))
  local le = '+Inf'
  for _, bound in ipairs(RUN_DURATION_BUCKETS_MS) do
    if ms <= bound then le = tostring(bound) break end
  end
  redis.call('HINCRBY', metrics, 'run_duration_le:' .. le, 1)
  redis.call('HINCRBY', metrics, 'run_duration_sum_ms', ms)
  redis.call('HINCRBY', metrics, 'run_duration_count', 1)
end
