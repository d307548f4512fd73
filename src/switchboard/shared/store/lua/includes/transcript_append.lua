-- transcript_append(session, stream, msg): append one message (JSON text) to a
-- transcript stream under the session's next sequence number (stream id `<seq>-0`);
-- answers the sequence number.
-- append_in(s, stream, msg): the same on a session read into a buffer
-- (includes/hash_buffer.lua): its `seq` is written with the buffer's other changes.
-- @include hash_buffer
local function transcript_append(session, stream, msg)
  local seq = redis.call('HINCRBY', session, 'seq', 1)
  redis.call('XADD', stream, seq .. '-0', 'm', msg)
  return seq
end
local function append_in(s, stream, msg)
  local seq = (tonumber(s.f.seq) or 0) + 1
  redis.call('XADD', stream, int_text(seq) .. '-0', 'm', msg)
  hash_set(s, 'seq', int_text(seq))
  return seq
end
