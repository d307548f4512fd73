-- Count a finished batch member; once all `expected` members have counted, exactly one
-- (the first to see the count complete, the same one on a retry) wins the join: answers
-- 1 for it, else 0 (also when the batch is gone).
-- KEYS: batch done
-- ARGV: spawn_id
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SADD', KEYS[2], ARGV[1])
local expected = tonumber(redis.call('HGET', KEYS[1], 'expected') or '0')
if redis.call('SCARD', KEYS[2]) < expected then return 0 end
redis.call('HSETNX', KEYS[1], 'joiner', ARGV[1])
if redis.call('HGET', KEYS[1], 'joiner') == ARGV[1] then return 1 end
return 0
