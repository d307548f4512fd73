-- Add children to the requester's active set if the limit allows all of them (members
-- already there count once); answers {1 taken | 0 refused, members before}.
-- KEYS: children
-- ARGV: limit *members
local n = redis.call('SCARD', KEYS[1])
local new = 0
for i = 2, #ARGV do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 0 then new = new + 1 end
end
if n + new > tonumber(ARGV[1]) then return {0, n} end
for i = 2, #ARGV do redis.call('SADD', KEYS[1], ARGV[i]) end
return {1, n}
