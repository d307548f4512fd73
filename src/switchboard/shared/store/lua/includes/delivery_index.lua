-- index_delivery(index, id, now, keep_s, prune_before): add a delivery to its session's
-- index at `now`, drop entries older than `prune_before` and keep the index keep_s.
local function index_delivery(index, id, now, keep_s, prune_before)
  redis.call('ZADD', index, now, id)
  redis.call('ZREMRANGEBYSCORE', index, '-inf', prune_before)
  redis.call('EXPIRE', index, keep_s)
end
