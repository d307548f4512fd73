-- Take one of a tool server's slots for a call, unless `limit` calls hold one, fairly
-- between the processes whose calls wait for one. Lapsed leases (their worker died) are
-- dropped first, so their slots come back. Leases are on the server's clock.
--
-- Processes wait in line (`queue`: process id -> ticket, `seen`: when each last asked; a
-- process not seen for `queue_ms` is dropped from the line, it died). A caller gets a slot
-- only when more are free than processes ahead of it in line, so a process that gives
-- slots back and asks again at once cannot keep them from one that waits. A process that
-- took a slot and has more calls waiting (`stay` = 1) goes to the back of the line, else
-- it leaves it. A caller with no `proc` ('') asks once, behind the line, and never joins
-- it. A holder that already holds a slot keeps it (its lease pushed on).
-- Answers {taken (1 | 0), slots held, processes ahead of the caller in line}.
-- KEYS: slots queue seen
-- ARGV: holder proc limit lease_ms stay queue_ms
-- @include tool_slot_clock
local slots, queue, seen = KEYS[1], KEYS[2], KEYS[3]
local holder, proc = ARGV[1], ARGV[2]
local limit, lease_ms, queue_ms = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local now = now_ms()
local function to_back()
  local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
  if last[1] == proc then
    return  -- at the back already
  end
  local ticket = now
  if last[2] then
    ticket = math.max(now, tonumber(last[2]) + 1)
  end
  redis.call('ZADD', queue, ticket, proc)
end
local function seen_now()
  redis.call('HSET', seen, proc, now)
  keep_until(queue, now + queue_ms)
  keep_until(seen, now + queue_ms)
end
redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
for _, p in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  local at = redis.call('HGET', seen, p)
  if not at or tonumber(at) + queue_ms <= now then
    redis.call('ZREM', queue, p)
    redis.call('HDEL', seen, p)
  end
end
local held = redis.call('ZCARD', slots)
local rank = proc ~= '' and redis.call('ZRANK', queue, proc) or false
local ahead = rank or redis.call('ZCARD', queue)
local mine = redis.call('ZSCORE', slots, holder)
if not mine and limit - held <= ahead then
  if proc ~= '' then
    if not rank then
      to_back()
    end
    seen_now()
  end
  return {0, held, ahead}
end
redis.call('ZADD', slots, now + lease_ms, holder)
keep_until_last_lease(slots, now)
if proc ~= '' and ARGV[5] == '1' then
  to_back()
  seen_now()
elseif rank then
  redis.call('ZREM', queue, proc)
  redis.call('HDEL', seen, proc)
end
return {1, redis.call('ZCARD', slots), 0}
