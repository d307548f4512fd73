-- Append a message to the requester's transcript while moving a field of the spawn or
-- batch hash from `expected` to `new` (the message and the state change are one step,
-- so the announce lands exactly once), touching the session's updatedAt. Answers the
-- message's sequence number, 0 when the field had moved already, -1 when the hash is gone.
-- KEYS: record session transcript
-- ARGV: field expected new message now
-- @include transcript_append
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if (redis.call('HGET', KEYS[1], ARGV[1]) or '') ~= ARGV[2] then return 0 end
local seq = transcript_append(KEYS[2], KEYS[3], ARGV[4])
redis.call('HSET', KEYS[2], 'updatedAt', ARGV[5])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return seq
