-- Move a field of an existing spawn or batch hash from `expected` to `new` (one caller
-- wins); answers 1 when moved, else 0.
-- KEYS: record
-- ARGV: field expected new
-- @include spawn_move_field
if move_field(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 1 end
return 0
