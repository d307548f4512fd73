-- Record a spawn's outcome once: unless the spawn is gone or its `guard` field is set
-- already, write the fields (a JSON object); answers 1 when written, else 0.
-- KEYS: spawn
-- ARGV: guard fields
-- @include set_fields
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
set_fields(KEYS[1], ARGV[2])
return 1
