-- A new child session takes its label unless another session holds it (labels are
-- unique); answers 1 when taken, else 0.
-- KEYS: labels session
-- ARGV: label session_key
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[2], 'label', ARGV[1])
return 1
