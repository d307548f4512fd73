-- The first page of the updatedAt indexes, newest first, with each listed session's hash:
-- what a listing needs, in one round trip. The indexes' rows (each newest first) are
-- merged by score, ties in index order then position, as `SessionStore.recent_page`
-- merges them.
-- The script learns the listed sessions only as it reads the indexes, and builds no key:
-- the caller passes the session hashes it expects (KEYS after the `indexes` first ones,
-- one per name of the JSON list `members`, in order; e.g. the previous page's). When a
-- listed member has no hash passed, nothing is read and the answer is
-- {'retry', members of the page}: the caller calls again with those (bounded).
-- Answers {member, score, flat HGETALL} per row, at most `want` rows.
-- KEYS: *keys
--   (keys: the `indexes` index keys, then the session hashes of `members`)
-- ARGV: max_score min_score want indexes members
local want, n = tonumber(ARGV[3]), tonumber(ARGV[4])
local hash_of = {}
for i, member in ipairs(cjson.decode(ARGV[5])) do hash_of[member] = KEYS[n + i] end
local lists, at = {}, {}
for i = 1, n do
  lists[i] = redis.call('ZREVRANGEBYSCORE', KEYS[i], ARGV[1], ARGV[2], 'WITHSCORES',
    'LIMIT', 0, want)
  at[i] = 1
end
local rows, missing = {}, false
while #rows < want do
  local best, best_score = nil, nil
  for i = 1, n do
    if at[i] <= #lists[i] then
      local score = tonumber(lists[i][at[i] + 1])
      if best == nil or score > best_score then best, best_score = i, score end
    end
  end
  if best == nil then break end
  local list, j = lists[best], at[best]
  rows[#rows + 1] = {list[j], list[j + 1]}
  if hash_of[list[j]] == nil then missing = true end
  at[best] = j + 2
end
if missing then
  local members = {}
  for i, row in ipairs(rows) do members[i] = row[1] end
  return {'retry', members}
end
for _, row in ipairs(rows) do row[3] = redis.call('HGETALL', hash_of[row[1]]) end
return rows
