-- Settle the attempt that holds the delivery (status sending, same attempt number): a
-- final outcome (due '') leaves the due index, a retry is due at `due` (ms). ttl_s 0
-- keeps the hash's expiry as it is. Answers 1 when settled, 0 when the attempt lost it.
-- KEYS: delivery due_index
-- ARGV: attempt fields ttl_s id due
-- @include set_fields
if redis.call('HGET', KEYS[1], 'status') ~= 'sending' then return 0 end
if redis.call('HGET', KEYS[1], 'attempts') ~= ARGV[1] then return 0 end
set_fields(KEYS[1], ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[3]) end
if ARGV[5] == '' then
  redis.call('ZREM', KEYS[2], ARGV[4])
else
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
end
return 1
