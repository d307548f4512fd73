-- move_field(key, field, expected, new): move a field of an existing hash from
-- `expected` ('' = unset) to `new`; false when the hash is gone or the field has moved
-- (one caller wins).
local function move_field(key, field, expected, new)
  if redis.call('EXISTS', key) == 0 then return false end
  if (redis.call('HGET', key, field) or '') ~= expected then return false end
  redis.call('HSET', key, field, new)
  return true
end
