-- Admit a batch's next lines up to its cap: answers {first line, how many} (0 when the
-- batch is not in progress, or is full); the admitted lines join `inflight`, scored by
-- when they were admitted.
-- KEYS: batch inflight
-- ARGV: now_ms
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return {0, 0} end
local cursor = tonumber(redis.call('HGET', KEYS[1], 'cursor') or '0')
local total = tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
local cap = tonumber(redis.call('HGET', KEYS[1], 'cap') or '1')
local free = cap - redis.call('ZCARD', KEYS[2])
local n = math.min(free, total - cursor)
if n <= 0 then return {cursor, 0} end
for i = cursor, cursor + n - 1 do redis.call('ZADD', KEYS[2], ARGV[1], i) end
redis.call('HSET', KEYS[1], 'cursor', cursor + n)
return {cursor, n}
