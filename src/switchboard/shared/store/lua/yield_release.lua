-- A yielded session whose children are all done with nothing left for a wake (no announce
-- stashed, no wake open: the last ones ended silently, or announce nothing) stops being
-- yielded. Answers 1 when it did, else 0 (not yielded, or something still pending).
-- KEYS: session kids inbox marker
-- ARGV:
if redis.call('HEXISTS', KEYS[1], 'yieldedAt') == 0 then return 0 end
if redis.call('SCARD', KEYS[2]) > 0 or redis.call('LLEN', KEYS[3]) > 0 then return 0 end
if redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
redis.call('HDEL', KEYS[1], 'yieldedAt', 'yieldedRunId', 'yieldMessage')
return 1
