-- End a finalizing batch (`completed`, or `expired` when it ends for its window) or a
-- cancelling one (`cancelled`), once nothing is in flight (and, finalizing, every line
-- is answered): its output and error lines become files (renamed, not copied), the batch
-- names them, and everything of the batch expires with its files. Answers 1 when this
-- call ended it, 0 when it was not (or no longer) to be ended.
-- KEYS: batch out err out_file out_lines err_file err_lines files live plans runs inflight done
-- ARGV: batch_id out_id err_id now_s ttl_s owner
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'finalizing' and status ~= 'cancelling' then return 0 end
if redis.call('ZCARD', KEYS[12]) > 0 then return 0 end
local total = tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
if status == 'finalizing' and redis.call('SCARD', KEYS[13]) < total then return 0 end
local ttl = tonumber(ARGV[5])
local function produce(list, file, lines, id, size, name, field)
  local n = redis.call('LLEN', list)
  if n == 0 then return end
  redis.call('RENAME', list, lines)
  redis.call('HSET', file, 'filename', name, 'purpose', 'batch_output',
    'bytes', redis.call('HGET', KEYS[1], size) or '0', 'lines', n,
    'createdAt', ARGV[4], 'owner', ARGV[6])
  redis.call('EXPIRE', file, ttl)
  redis.call('EXPIRE', lines, ttl)
  redis.call('ZADD', KEYS[8], tonumber(ARGV[4]) * 1000, id)
  redis.call('EXPIRE', KEYS[8], ttl)
  redis.call('HSET', KEYS[1], field, id)
end
produce(KEYS[2], KEYS[4], KEYS[5], ARGV[2], 'outBytes',
  'batch_' .. ARGV[1] .. '_output.jsonl', 'outputFileId')
produce(KEYS[3], KEYS[6], KEYS[7], ARGV[3], 'errBytes',
  'batch_' .. ARGV[1] .. '_error.jsonl', 'errorFileId')
if status == 'cancelling' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'cancelledAt', ARGV[4])
elseif redis.call('HGET', KEYS[1], 'ending') == 'expired' then
  redis.call('HSET', KEYS[1], 'status', 'expired', 'expiredAt', ARGV[4])
else
  redis.call('HSET', KEYS[1], 'status', 'completed', 'completedAt', ARGV[4])
end
for i = 1, 13 do
  if i ~= 8 and i ~= 9 then redis.call('EXPIRE', KEYS[i], ttl) end
end
redis.call('ZREM', KEYS[9], ARGV[1])
return 1
