-- The server's clock in ms, the one every tool-slot lease is on (workers' clocks may differ),
-- and keeping a tool server's keys alive only as long as their leases (a server no call
-- uses leaves nothing behind).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function keep_until(key, until_ms)
  local ttl = redis.call('PTTL', key)
  local want = math.max(1, until_ms - now_ms())
  if ttl < want then
    redis.call('PEXPIRE', key, want)
  end
end
local function keep_until_last_lease(key, now)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now))
  end
end
