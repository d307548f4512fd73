-- Expire a running batch past its completion window: no more lines are admitted, and its
-- status becomes `finalizing` marked `ending: expired` (the caller cancels the runs in
-- flight and answers the lines never admitted). Answers 1 when this call expired it.
-- KEYS: batch
-- ARGV: now_s
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'finalizing', 'finalizingAt', ARGV[1], 'ending', 'expired')
return 1
