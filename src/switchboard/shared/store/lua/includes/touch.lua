-- touch(session, idx_all, idx_agent, idx_kind, member, now): mark a session active at
-- `now` in its hash and its three updatedAt indexes.
-- touch_in(s, idx_all, idx_agent, idx_kind, member, now): the same on a session read into
-- a buffer (includes/hash_buffer.lua): updatedAt is written with the buffer's other
-- changes, and the indexes once per step however often the step touches it at `now`.
-- @include hash_buffer
local function touch(session, idx_all, idx_agent, idx_kind, member, now)
  redis.call('HSET', session, 'updatedAt', now)
  redis.call('ZADD', idx_all, now, member)
  redis.call('ZADD', idx_agent, now, member)
  redis.call('ZADD', idx_kind, now, member)
end
local function touch_in(s, idx_all, idx_agent, idx_kind, member, now)
  if s.touched == now then return end
  s.touched = now
  hash_set(s, 'updatedAt', now)
  redis.call('ZADD', idx_all, now, member)
  redis.call('ZADD', idx_agent, now, member)
  redis.call('ZADD', idx_kind, now, member)
end
