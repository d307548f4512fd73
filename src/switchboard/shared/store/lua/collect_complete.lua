-- Record a collector child's completion once: its fields, its entry in the requester's
-- completion log (the entry id is its place in completion order, kept as `completedSeq`)
-- and one slot of its group freed. Answers {'ok'|'again'|'missing', tokens...}: the wait
-- tokens registered on the child (fields `w:<token>`), on a repeat too, so a step that
-- ran twice wakes its waiters again.
-- KEYS: record log group
-- ARGV: run_id now fields retention_s log_cap
-- @include set_fields
local record = KEYS[1]
if redis.call('EXISTS', record) == 0 then return {'missing'} end
local verdict = 'again'
if not redis.call('HGET', record, 'completedSeq') then
  local seq = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'runId', ARGV[1])
  set_fields(record, ARGV[3])
  redis.call('HSET', record, 'completedAt', ARGV[2], 'completedSeq', seq)
  redis.call('EXPIRE', record, ARGV[4])
  redis.call('EXPIRE', KEYS[2], ARGV[4])
  if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('HINCRBY', KEYS[3], 'active', -1) end
  verdict = 'ok'
end
local out = {verdict}
for _, name in ipairs(redis.call('HKEYS', record)) do
  if string.sub(name, 1, 2) == 'w:' then out[#out + 1] = string.sub(name, 3) end
end
return out
