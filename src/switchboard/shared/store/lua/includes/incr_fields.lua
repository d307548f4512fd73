-- incr_fields(key, json): add the integers of a JSON object to a hash's fields
-- ('' = nothing to add).
local function incr_fields(key, json)
  if json == '' then return end
  for k, v in pairs(cjson.decode(json)) do
    redis.call('HINCRBY', key, k, v)
  end
end
