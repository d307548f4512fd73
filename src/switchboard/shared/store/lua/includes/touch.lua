-- touch(session, idx_all, idx_agent, idx_kind, member, now): mark a session active at
-- `now` in its hash and its three updatedAt indexes.
local function touch(session, idx_all, idx_agent, idx_kind, member, now)
  redis.call('HSET', session, 'updatedAt', now)
  redis.call('ZADD', idx_all, now, member)
  redis.call('ZADD', idx_agent, now, member)
  redis.call('ZADD', idx_kind, now, member)
end
