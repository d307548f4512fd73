-- Scan the last messages of several transcripts (one slot group) for needles, server-side,
-- so only the ids and match counts of candidate messages cross the wire: per transcript,
-- the newest `per_key` entries, ASCII-lower-cased; an entry holding at least one needle
-- (plain text) is answered with its weight: 1000 when it holds `phrase`, plus one per
-- needle found. Answers, per transcript, {entry_id, weight, ...} newest first.
-- KEYS: *transcripts
-- ARGV: per_key phrase *needles
local per_key = tonumber(ARGV[1])
local phrase = ARGV[2]
local needles = {}
for i = 3, #ARGV do needles[#needles + 1] = ARGV[i] end
local out = {}
for k, key in ipairs(KEYS) do
  local found = {}
  local rows = redis.call('XREVRANGE', key, '+', '-', 'COUNT', per_key)
  for _, row in ipairs(rows) do
    local fields = row[2]
    for j = 1, #fields - 1, 2 do
      if fields[j] == 'm' then
        local text = string.lower(fields[j + 1])
        local weight = 0
        for _, needle in ipairs(needles) do
          if string.find(text, needle, 1, true) then weight = weight + 1 end
        end
        if weight > 0 then
          if phrase ~= '' and string.find(text, phrase, 1, true) then weight = weight + 1000 end
          found[#found + 1] = row[1]
          found[#found + 1] = weight
        end
      end
    end
  end
  out[k] = found
end
return out
