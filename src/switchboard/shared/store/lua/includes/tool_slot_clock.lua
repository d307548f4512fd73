-- The server's clock in ms, the one every tool-slot lease is on (workers' clocks may differ),
-- and keeping the slots key alive until its furthest lease ends (a server no call uses
-- leaves nothing behind).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function keep_until_last_lease(key, now)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now))
  end
end
