-- Answer one line of a batch, once: its line goes to the output or the error lines and
-- the counts move, and the next lines are admitted in its place (as obatch_admit); a line
-- answered already changes nothing. Answers {applied, finalize, first admitted, how many
-- admitted}: finalize is 1 when this answer ended the batch's work (every line answered,
-- or the last run in flight of a cancelling batch, or the last line of an expiring one).
-- KEYS: batch done inflight out err
-- ARGV: line kind text now_s now_ms
-- @include obatch_admit_next
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, 0, 0} end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then return {0, 0, 0, 0} end
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[2] == 'out' then
  redis.call('RPUSH', KEYS[4], ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'completed', 1)
  redis.call('HINCRBY', KEYS[1], 'outBytes', string.len(ARGV[3]) + 1)
else
  redis.call('RPUSH', KEYS[5], ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'failed', 1)
  redis.call('HINCRBY', KEYS[1], 'errBytes', string.len(ARGV[3]) + 1)
end
local status = redis.call('HGET', KEYS[1], 'status')
local total = tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
if status == 'in_progress' and redis.call('SCARD', KEYS[2]) >= total then
  redis.call('HSET', KEYS[1], 'status', 'finalizing', 'finalizingAt', ARGV[4])
  return {1, 1, 0, 0}
end
if status == 'finalizing' and redis.call('SCARD', KEYS[2]) >= total then return {1, 1, 0, 0} end
if status == 'cancelling' and redis.call('ZCARD', KEYS[3]) == 0 then return {1, 1, 0, 0} end
local admitted = admit_next(KEYS[1], KEYS[3], ARGV[5])
return {1, 0, admitted[1], admitted[2]}
