-- Mark a run as waited for (its end is then published, see finish_run.lua) and read it:
-- marked before it ends, its end is published; ended first, this read sees the outcome.
-- Answers its HGETALL (empty when unknown: nothing is written then).
-- KEYS: run
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
redis.call('HSET', KEYS[1], 'watch', '1')
return redis.call('HGETALL', KEYS[1])
