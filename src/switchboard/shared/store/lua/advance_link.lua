-- A `LinkAdvance` on its own: 1 when made, 0 when the hash has moved on.
-- KEYS: link
-- ARGV: status turn fields ttl_s
-- @include link_advance
if link_advance(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 1 end
return 0
