-- Mark when a scoped token was last used, only while it exists: a revoke (DEL) that lands
-- between the api's check and this mark must not bring a stub of the token back.
-- KEYS: token
-- ARGV: at_ms
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'lastUsed', ARGV[1])
return 1
