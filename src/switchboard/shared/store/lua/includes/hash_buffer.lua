-- A hash a step reads once and writes once, however many of its fields it changes:
-- hash_open(key) reads it (one HGETALL); hash_new(key, t) stands for a hash this step
-- creates with the fields of t (nothing read). hash_set(b, name, value) and
-- hash_del(b, name) change the copy (hash_update(b, t): a table's text values, cjson.null
-- deleting); hash_flush(b) writes what changed (one HSET, and one HDEL of deleted fields
-- that were there); hash_flat(b) answers the fields as HGETALL does. b.f holds the
-- fields as they are after the changes; b.exists, whether the hash was there when read.
-- int_text(n): an integer as Redis writes it (HINCRBY's text).
local function int_text(n)
  return string.format('%d', n)
end
local function hash_new(key, t)
  local b = {key = key, f = {}, w = {}, gone = {}, exists = false}
  for k, v in pairs(t) do
    if v ~= cjson.null then b.f[k] = v; b.w[k] = v end
  end
  return b
end
local function hash_open(key)
  local flat = redis.call('HGETALL', key)
  local b = {key = key, f = {}, w = {}, gone = {}, exists = #flat > 0}
  for i = 1, #flat, 2 do b.f[flat[i]] = flat[i + 1] end
  return b
end
local function hash_set(b, name, value)
  b.f[name] = value
  b.w[name] = value
  b.gone[name] = nil
end
local function hash_del(b, name)
  if b.f[name] == nil then return end
  b.f[name] = nil
  b.w[name] = nil
  b.gone[name] = true
end
local function hash_update(b, t)
  for k, v in pairs(t) do
    if v == cjson.null then hash_del(b, k) else hash_set(b, k, v) end
  end
end
local function hash_flush(b)
  local set, gone = {}, {}
  for k, v in pairs(b.w) do set[#set + 1] = k; set[#set + 1] = v end
  for k in pairs(b.gone) do gone[#gone + 1] = k end
  if #set > 0 then redis.call('HSET', b.key, unpack(set)) end
  if #gone > 0 then redis.call('HDEL', b.key, unpack(gone)) end
  b.w, b.gone = {}, {}
end
local function hash_flat(b)
  local flat = {}
  for k, v in pairs(b.f) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  return flat
end
