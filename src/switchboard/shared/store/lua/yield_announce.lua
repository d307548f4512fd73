-- An announce for a session, moving a field of the spawn or batch hash from `expected` to
-- `new` in the same step (so it lands exactly once). While the session is yielded (its
-- hash has `yieldedAt`) the announce joins the session's yield inbox (`entry`, JSON) and
-- the wake marker is set unless a wake is already open (the first announce opens one,
-- named `wake_id`); otherwise it is appended to the transcript, touching updatedAt, or,
-- with `only_yielded` '1', nothing is written (answer -3: the caller announces its way).
-- Answers {code, open wake id or ''}: code > 0 the appended message's sequence number;
-- -2 stashed for a wake (third element 1 when this call opened it); 0 the field had moved
-- already (the open wake, if any, is named so a step run again can enqueue it again);
-- -1 the hash is gone.
-- KEYS: record session transcript inbox marker
-- ARGV: field expected new message entry now wake_id only_yielded
-- @include transcript_append
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, ''} end
if (redis.call('HGET', KEYS[1], ARGV[1]) or '') ~= ARGV[2] then
  return {0, redis.call('GET', KEYS[5]) or ''}
end
local yielded = redis.call('HEXISTS', KEYS[2], 'yieldedAt') == 1
if not yielded and ARGV[8] == '1' then return {-3, ''} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if yielded then
  redis.call('RPUSH', KEYS[4], ARGV[5])
  redis.call('HSET', KEYS[2], 'updatedAt', ARGV[6])
  local open = redis.call('GET', KEYS[5])
  if open then return {-2, open, 0} end
  redis.call('SET', KEYS[5], ARGV[7])
  return {-2, ARGV[7], 1}
end
local seq = transcript_append(KEYS[2], KEYS[3], ARGV[4])
redis.call('HSET', KEYS[2], 'updatedAt', ARGV[6])
return {seq, ''}
