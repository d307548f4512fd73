-- set_table(key, t): set the text values of a table on a hash (a cjson.null value
-- deletes its field), in one HSET and one HDEL.
-- set_fields(key, json): the same from a JSON object ('' = nothing to set).
local function set_table(key, t)
  local set, gone = {}, {}
  for k, v in pairs(t) do
    if v == cjson.null then gone[#gone + 1] = k else set[#set + 1] = k; set[#set + 1] = v end
  end
  if #set > 0 then redis.call('HSET', key, unpack(set)) end
  if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
end
local function set_fields(key, json)
  if json == '' then return end
  set_table(key, cjson.decode(json))
end
