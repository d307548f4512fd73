-- admit_next(batch, inflight, now_ms): admit a running batch's next lines up to its cap
-- (they join `inflight`, scored by `now_ms`, and the cursor moves past them); answers
-- {first line, how many} ({cursor, 0} when it is not in progress or is full).
local function admit_next(batch, inflight, now_ms)
  local cursor = tonumber(redis.call('HGET', batch, 'cursor') or '0')
  if redis.call('HGET', batch, 'status') ~= 'in_progress' then return {cursor, 0} end
  local total = tonumber(redis.call('HGET', batch, 'total') or '0')
  local cap = tonumber(redis.call('HGET', batch, 'cap') or '1')
  local n = math.min(cap - redis.call('ZCARD', inflight), total - cursor)
  if n <= 0 then return {cursor, 0} end
  for i = cursor, cursor + n - 1 do redis.call('ZADD', inflight, now_ms, i) end
  redis.call('HSET', batch, 'cursor', cursor + n)
  return {cursor, n}
end
