-- Append one message to a session's transcript outside a run and touch the session's
-- updatedAt field; answers its sequence number.
-- KEYS: session transcript
-- ARGV: message now
-- @include transcript_append
local seq = transcript_append(KEYS[1], KEYS[2], ARGV[1])
redis.call('HSET', KEYS[1], 'updatedAt', ARGV[2])
return seq
