-- Take `n` child slots of a collector group if both caps allow them: children not yet
-- completed (`active`) and children over the group's life (`total`). Answers
-- {'ok'|'active'|'total', active before, total before}: the cap that refused, if any.
-- KEYS: group
-- ARGV: n max_active max_total ttl_s
local n = tonumber(ARGV[1])
local h = redis.call('HMGET', KEYS[1], 'active', 'total')
local active, total = tonumber(h[1] or '0'), tonumber(h[2] or '0')
if active + n > tonumber(ARGV[2]) then return {'active', active, total} end
if total + n > tonumber(ARGV[3]) then return {'total', active, total} end
redis.call('HINCRBY', KEYS[1], 'active', n)
redis.call('HINCRBY', KEYS[1], 'total', n)
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {'ok', active, total}
