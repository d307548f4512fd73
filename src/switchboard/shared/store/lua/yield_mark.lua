-- Mark a session yielded (its fields, JSON for set_fields) only if it has a pending child;
-- answers 1 when marked, 0 when nothing is pending (nothing written).
-- KEYS: session kids
-- ARGV: fields
-- @include set_fields
if redis.call('SCARD', KEYS[2]) == 0 then return 0 end
set_fields(KEYS[1], ARGV[1])
return 1
