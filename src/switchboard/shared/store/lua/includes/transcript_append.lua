-- transcript_append(session, stream, msg): append one message (JSON text) to a
-- transcript stream under the session's next sequence number (stream id `<seq>-0`);
-- answers the sequence number.
local function transcript_append(session, stream, msg)
  local seq = redis.call('HINCRBY', session, 'seq', 1)
  redis.call('XADD', stream, seq .. '-0', 'm', msg)
  return seq
end
