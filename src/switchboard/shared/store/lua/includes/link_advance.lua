-- link_advance(key, status, turn, fields, ttl_s): a compare-and-set on a hash
-- (`LinkAdvance`): unless its `status` is still `status` (and its `turn` is `turn`,
-- '' = any), false; else write the fields (a JSON object, or a decoded table; null
-- deletes one), keep the hash ttl_s, true.
-- @include set_fields
local function link_advance(key, status, turn, fields, ttl_s)
  if redis.call('HGET', key, 'status') ~= status then return false end
  if turn ~= '' and redis.call('HGET', key, 'turn') ~= turn then return false end
  if type(fields) == 'table' then set_table(key, fields) else set_fields(key, fields) end
  redis.call('EXPIRE', key, ttl_s)
  return true
end
