-- Forget a flow step that has run, unless it was enqueued again after it started (its
-- score changed); answers 1 when forgotten, else 0.
-- KEYS: steps
-- ARGV: member started_score
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
