-- Steer a message into a session's turn in flight: when `holder` still holds the lane and
-- its run is queued, running or parked, append the message (transcript-form JSON) to the
-- session's steer inbox and count it on the session (`steerQueued`: a claim, resume or end
-- that reads the session learns from it that the inbox holds something) and answer
-- 'steered'; otherwise nothing is written: 'idle' (the caller queues a next turn).
-- KEYS: lane run session steer
-- ARGV: holder message
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'idle' end
local st = redis.call('HGET', KEYS[2], 'status')
if st ~= 'running' and st ~= 'parked' and st ~= 'queued' then return 'idle' end
redis.call('RPUSH', KEYS[4], ARGV[2])
redis.call('HINCRBY', KEYS[3], 'steerQueued', 1)
return 'steered'
