-- Count one child's completion (`run_id`) on wait tokens, once per token and child; a
-- token (a run-shaped hash an `agents_wait` waits on) still running whose count of
-- completions to wait for (`left`) reaches 0 ends as 'ok', published on the run-ended
-- channel when watched, as a run's end is. Answers the parked runs waiting on the tokens
-- that have ended (also for one ended before, so a repeat wakes them again).
-- KEYS: *tokens
--   (tokens: pairs of a token's hash and its waiters set)
-- ARGV: channel now retention_s run_id *token_ids
local out = {}
for i = 1, #KEYS, 2 do
  local token, waiters = KEYS[i], KEYS[i + 1]
  local status = redis.call('HGET', token, 'status')
  if status == 'running' and redis.call('HSETNX', token, 'd:' .. ARGV[4], '1') == 1 then
    if redis.call('HINCRBY', token, 'left', -1) <= 0 then status = 'fire' end
  end
  if status == 'fire' then
    redis.call('HSET', token, 'status', 'ok', 'endedAt', ARGV[2])
    redis.call('EXPIRE', token, ARGV[3])
    local h = redis.call('HMGET', token, 'watch', 'sessionKey', 'createdAt')
    if h[1] == '1' then  -- the run-shaped fields a waiter reads (not the counted children)
      local fields = {status = 'ok', kind = 'wait', sessionKey = h[2], createdAt = h[3],
        endedAt = ARGV[2]}
      local id = ARGV[4 + (i + 1) / 2]
      redis.call('PUBLISH', ARGV[1], cjson.encode({runId = id, run = fields}))
    end
  end
  if status and status ~= 'running' then  -- gone once its wait has answered
    for _, w in ipairs(redis.call('SMEMBERS', waiters)) do out[#out + 1] = w end
    redis.call('EXPIRE', waiters, ARGV[3])
  end
end
return out
