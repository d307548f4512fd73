-- Scan the last messages of several transcripts (one slot group) for any of the needles,
-- server-side, so only candidate messages cross the wire: per transcript, the newest
-- `per_key` entries, each kept when its JSON, ASCII-lower-cased, contains a needle as
-- plain text. Answers, per transcript, {entry_id, message_json, ...} newest first.
-- KEYS: *transcripts
-- ARGV: per_key *needles
local per_key = tonumber(ARGV[1])
local needles = {}
for i = 2, #ARGV do needles[#needles + 1] = ARGV[i] end
local out = {}
for k, key in ipairs(KEYS) do
  local found = {}
  local rows = redis.call('XREVRANGE', key, '+', '-', 'COUNT', per_key)
  for _, row in ipairs(rows) do
    local fields = row[2]
    for j = 1, #fields - 1, 2 do
      if fields[j] == 'm' then
        local text = string.lower(fields[j + 1])
        for _, needle in ipairs(needles) do
          if string.find(text, needle, 1, true) then
            found[#found + 1] = row[1]
            found[#found + 1] = fields[j + 1]
            break
          end
        end
      end
    end
  end
  out[k] = found
end
return out
