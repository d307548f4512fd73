-- Copy the last messages of one transcript to the end of another session's transcript, in
-- order, under that session's sequence numbers (a forked sub-agent starts from a copy of
-- its requester's history); answers how many were copied.
-- KEYS: source session transcript
-- ARGV: limit now
-- @include transcript_append
local rows = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[1])
local copied = 0
for i = #rows, 1, -1 do
  local fields = rows[i][2]
  for j = 1, #fields - 1, 2 do
    if fields[j] == 'm' then
      transcript_append(KEYS[2], KEYS[3], fields[j + 1])
      copied = copied + 1
    end
  end
end
if copied > 0 then redis.call('HSET', KEYS[2], 'updatedAt', ARGV[2]) end
return copied
