-- create_session(session, sid_index, key, now, sid, fields): a new session entry
-- (sessionId, createdAt, seq 0, its first JSON fields) unless it exists; 1 if made.
-- @include set_fields
local function create_session(session, sid_index, key, now, sid, fields)
  if redis.call('EXISTS', session) == 1 then return 0 end
  redis.call('HSET', session, 'sessionId', sid, 'createdAt', now, 'seq', 0)
  redis.call('HSET', sid_index, sid, key)
  set_fields(session, fields)
  return 1
end
