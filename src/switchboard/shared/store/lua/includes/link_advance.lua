-- link_advance(key, status, turn, fields, ttl_s): a compare-and-set on a hash
-- (`LinkAdvance`): unless its `status` is still `status` (and its `turn` is `turn`,
-- '' = any), false; else write the fields (a JSON object, or a decoded table; null
-- deletes one), keep the hash ttl_s, true.
-- Its two halves, for a step that writes more on the hash: link_check(key, status, turn,
-- fields, field) reads the hash once (HMGET) and answers nil when it has moved on, else
-- which of the fields it deletes are there and the value of `field` ('' = none) as
-- {present = set, field = value or false}; link_write(key, set, gone, ttl_s) writes a
-- table of fields, deletes the `gone` list and keeps the hash ttl_s.
local function link_check(key, status, turn, fields, field)
  local names = {'status', 'turn'}
  for k, v in pairs(fields) do
    if v == cjson.null then names[#names + 1] = k end
  end
  if field ~= '' then names[#names + 1] = field end
  local got = redis.call('HMGET', key, unpack(names))
  if got[1] ~= status then return nil end
  if turn ~= '' and got[2] ~= turn then return nil end
  local present = {}
  for i = 3, #names do
    if got[i] then present[names[i]] = true end
  end
  return {present = present, field = field ~= '' and got[#names] or false}
end
local function link_write(key, set, gone, ttl_s)
  local flat = {}
  for k, v in pairs(set) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  if #flat > 0 then redis.call('HSET', key, unpack(flat)) end
  if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
  redis.call('EXPIRE', key, ttl_s)
end
-- The fields of an advance split into those to set and those to delete (only the ones
-- `present` says are there).
local function link_split(fields, present, set)
  local gone = {}
  for k, v in pairs(fields) do
    if v == cjson.null then
      if present[k] then gone[#gone + 1] = k end
    else
      set[k] = v
    end
  end
  return gone
end
local function link_advance(key, status, turn, fields, ttl_s)
  if type(fields) ~= 'table' then
    fields = fields == '' and {} or cjson.decode(fields)
  end
  local seen = link_check(key, status, turn, fields, '')
  if not seen then return false end
  local set = {}
  local gone = link_split(fields, seen.present, set)
  link_write(key, set, gone, ttl_s)
  return true
end
