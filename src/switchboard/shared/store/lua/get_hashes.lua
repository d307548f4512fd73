-- Read several hashes in one reply (one parse, no per-command overhead): one flat
-- HGETALL reply per key (empty when missing).
-- KEYS: *hashes
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('HGETALL', key) end
return out
