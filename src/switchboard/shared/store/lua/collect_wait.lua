-- Read collector children for an `agents_wait` by their requester, in one step: per
-- child 'n' (unknown), 'o' (another requester's) or 'p' (pending), or its hash
-- (completed). With mode 'any', when none is completed and some are pending, or mode
-- 'all', when some are pending, a wait token is created (a run-shaped hash, status
-- running, watched, `left`: the completions that fire it, 1 or every pending one) and
-- registered on every pending child (field `w:<token>`), so their completions fire it
-- (collect_complete.lua, collect_fire.lua). Mode 'none' only reads. Answers
-- {registered 1|0, per child...}.
-- KEYS: token *records
-- ARGV: requester token_id now ttl_s mode
local requester = ARGV[1]
local out = {0}
local completed, pending = 0, 0
for i = 2, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'requesterKey', 'completedSeq')
  if not h[1] then
    out[i] = 'n'
  elseif h[1] ~= requester then
    out[i] = 'o'
  elseif h[2] then
    out[i] = redis.call('HGETALL', KEYS[i])
    completed = completed + 1
  else
    out[i] = 'p'
    pending = pending + 1
  end
end
local mode = ARGV[5]
if pending > 0 and (mode == 'all' or (mode == 'any' and completed == 0)) then
  local left = 1
  if mode == 'all' then left = pending end
  redis.call('HSET', KEYS[1], 'status', 'running', 'kind', 'wait', 'sessionKey', requester,
    'createdAt', ARGV[3], 'watch', '1', 'left', left)
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  local field = 'w:' .. ARGV[2]
  for i = 2, #KEYS do
    if out[i] == 'p' then redis.call('HSET', KEYS[i], field, '1') end
  end
  out[1] = 1
end
return out
