-- A run event's data as `events.run_event` shapes it: the fields given, plus the run's
-- flowId, spawnId and batchId from its `meta` JSON (those set).
local function run_event_data(ev, meta_json)
  if meta_json then
    local ok, meta = pcall(cjson.decode, meta_json)
    if ok and type(meta) == 'table' then
      for _, name in ipairs({'flowId', 'spawnId', 'batchId'}) do
        local v = meta[name]
        if v and v ~= cjson.null and v ~= '' and v ~= false then ev[name] = v end
      end
    end
  end
  return cjson.encode(ev)
end
