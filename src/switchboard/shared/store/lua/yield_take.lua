-- A wake step takes its session's yield inbox: once, for the open wake it names. The
-- announces move to the wake hash (status `taken`, with the yield message), the inbox and
-- the marker are deleted, and the session stops being yielded when no child is pending any
-- more (its active children, less those whose announce was just taken). A step run again
-- finds the wake hash and answers what it holds.
-- Answers {status, run id, announces (JSON array), yield message, yielded run id} or
-- {'stale'} when the marker names another wake (or none) and this wake was never taken.
-- KEYS: wake marker inbox session kids
-- ARGV: wake_id session_key now retention_s
local st = redis.call('HGET', KEYS[1], 'status')
if st then
  local h = redis.call('HMGET', KEYS[1], 'runId', 'announces', 'yieldMessage', 'yieldedRunId')
  return {st, h[1] or '', h[2] or '[]', h[3] or '', h[4] or ''}
end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {'stale'} end
local items = redis.call('LRANGE', KEYS[3], 0, -1)
redis.call('DEL', KEYS[3], KEYS[2])
local taken = {}
for _, item in ipairs(items) do
  local ok, e = pcall(cjson.decode, item)
  if ok and type(e) == 'table' and e.childKey then taken[e.childKey] = true end
end
local left = 0
for _, child in ipairs(redis.call('SMEMBERS', KEYS[5])) do
  if not taken[child] then left = left + 1 end
end
local msg = redis.call('HGET', KEYS[4], 'yieldMessage') or ''
local yielded_run = redis.call('HGET', KEYS[4], 'yieldedRunId') or ''
if left == 0 then
  redis.call('HDEL', KEYS[4], 'yieldedAt', 'yieldedRunId', 'yieldMessage')
end
local announces = '[' .. table.concat(items, ',') .. ']'
redis.call('HSET', KEYS[1], 'status', 'taken', 'sessionKey', ARGV[2], 'announces', announces,
  'yieldMessage', msg, 'yieldedRunId', yielded_run, 'takenAt', ARGV[3], 'pendingLeft', left)
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {'taken', '', announces, msg, yielded_run}
