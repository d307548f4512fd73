-- Fire wait tokens: a token (a run-shaped hash an `agents_wait` waits on) still running
-- ends as 'ok', published on the run-ended channel when watched, as a run's end is.
-- Answers the parked runs waiting on any of them (also for a token fired before, so a
-- repeat wakes them again).
-- KEYS: *tokens
--   (tokens: pairs of a token's hash and its waiters set)
-- ARGV: channel now retention_s *token_ids
local out = {}
for i = 1, #KEYS, 2 do
  local token, waiters = KEYS[i], KEYS[i + 1]
  local status = redis.call('HGET', token, 'status')
  if status == 'running' then
    redis.call('HSET', token, 'status', 'ok', 'endedAt', ARGV[2])
    redis.call('EXPIRE', token, ARGV[3])
    if redis.call('HGET', token, 'watch') == '1' then
      local flat = redis.call('HGETALL', token)
      local fields = {}
      for j = 1, #flat, 2 do fields[flat[j]] = flat[j + 1] end
      local id = ARGV[3 + (i + 1) / 2]
      redis.call('PUBLISH', ARGV[1], cjson.encode({runId = id, run = fields}))
    end
  end
  if status then  -- a token whose wait has answered is gone: nothing waits on it
    for _, w in ipairs(redis.call('SMEMBERS', waiters)) do out[#out + 1] = w end
    redis.call('EXPIRE', waiters, ARGV[3])
  end
end
return out
