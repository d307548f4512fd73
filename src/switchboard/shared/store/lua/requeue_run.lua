-- Put a run whose worker vanished back in the queued state so it can be claimed again.
-- Answers 'queued', 'moved' (another attempt runs it) or the status it is in.
-- KEYS: run
-- ARGV: attempt
--   (attempt: the attempt expected to be running; '' = any)
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'running' then return st or '' end
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return 'moved' end
redis.call('HSET', KEYS[1], 'status', 'queued')
return 'queued'
