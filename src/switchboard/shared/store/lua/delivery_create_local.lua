-- Create a delivery to a channel served inside the product and settle it in the same
-- step: the send is a store write (a `delivery` event for webchat), so there is nothing
-- to retry and nothing to leave in the due index. The send policy is `policy` when
-- decided by the caller, else ('') the session's own override (`sendPolicy`), read here.
-- webchat_event: the `delivery` event's data ('' = none); delivered_event/denied_event:
-- the `delivery.settled` event's data for each outcome; denied_error: the delivery's
-- lastError when denied.
-- Answers 0 when the delivery exists, 1 when delivered, 2 when denied.
-- KEYS: delivery session_index events session
-- ARGV: fields id now keep_s prune_before policy webchat_event events_maxlen delivered_event denied_event denied_error
-- @include set_fields
-- @include delivery_index
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local policy = ARGV[6]
if policy == '' then
  policy = 'allow'
  local override = redis.call('HGET', KEYS[4], 'sendPolicy')
  if override and string.lower(string.match(override, '^%s*(.-)%s*$')) == 'deny' then
    policy = 'deny'
  end
end
set_fields(KEYS[1], ARGV[1])
local outcome = 1
if policy == 'deny' then
  outcome = 2
  redis.call('HSET', KEYS[1], 'status', 'denied', 'lastError', ARGV[11], 'attempts', 1)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'type', 'delivery.settled',
    'data', ARGV[10])
else
  if ARGV[7] ~= '' then
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'type', 'delivery', 'data', ARGV[7])
  end
  redis.call('HSET', KEYS[1], 'status', 'delivered', 'deliveredAt', ARGV[3], 'attempts', 1)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'type', 'delivery.settled',
    'data', ARGV[9])
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
index_delivery(KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
return outcome
