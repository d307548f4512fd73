-- Cancel a batch: a validating or running one becomes `cancelling` (nothing more is
-- admitted). Answers {status after, finalize}: finalize is 1 when no line is in flight
-- (nothing will end it otherwise).
-- KEYS: batch inflight
-- ARGV: now_s
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'', 0} end
if status == 'validating' or status == 'in_progress' then
  redis.call('HSET', KEYS[1], 'status', 'cancelling', 'cancellingAt', ARGV[1])
  status = 'cancelling'
end
if status == 'cancelling' and redis.call('ZCARD', KEYS[2]) == 0 then return {status, 1} end
return {status, 0}
