-- Start a run in one step: create the session entry if missing and touch it (as
-- ensure_session); map the idempotency key to the run unless it already names one (then
-- record nothing; with an advance that applies, no key is needed nor written); record the
-- run and take the lane or queue behind the holder (as submit_run).
-- A record written with the run, at the `link` hash (the store does not know what it
-- is; a caller's own record that must exist exactly when the run does):
--   link_field: name the run (or the one the idempotency key names) in this field of
--     `link` unless the field is set (first writer wins); '' = no link.
--   record: JSON {fields, ttl_s, member, score, trim_to}: first write these fields on
--     `link` (a new hash: the link field is written with them), keep it ttl_s, and add
--     member at score to each of *record_indexes (sorted sets kept ttl_s, members at or
--     below trim_to dropped; trim_to 0: none this time); '' = none.
--   advance_*: first a compare-and-set on `link` (includes/link_advance.lua); when the
--     hash has moved on, nothing is written and the answer is {'moved'};
--     advance_status '' = none.
-- claim: JSON {history, max_attempts, timeout_ms, events_cap, after_sid, after_seq}: a
-- run that took the lane is claimed in the same step (as claim_run, its history after
-- the caller's window when that still applies) for the caller to execute at once, the
-- claim's answer the fifth element; '' = no claim.
-- The session and the run are each written once (includes/hash_buffer.lua), the link
-- once (its compare-and-set reads it once, and the field naming the run is written with
-- the rest).
-- Answers {created, sessionId, 'lane' | 'queued' | 'duplicate', the run id the
-- idempotency key names[, claim]}.
-- Without an idempotency key or a link, `idempotency` and `link` are the run's own hash
-- (a key the script names anyway: never written through those names).
-- KEYS: session sid_index idx_all idx_agent idx_kind run lane lane_queue leases idempotency link transcript events notices *record_indexes
-- ARGV: session_key now session_id on_create run_id lease_at_ms run_fields idem_ttl_s link_field record claim advance_status advance_turn advance_fields advance_ttl_s
-- @include hash_buffer
-- @include link_advance
-- @include touch
-- @include claim_run
local session, run_key, link = KEYS[1], KEYS[6], KEYS[11]
local lane, lane_queue, leases = KEYS[7], KEYS[8], KEYS[9]
local session_key, now, run_id, lease_at_ms = ARGV[1], ARGV[2], ARGV[5], ARGV[6]
local link_field = ARGV[9]
local adv, seen = nil, nil
if ARGV[12] ~= '' then
  adv = ARGV[14] == '' and {} or cjson.decode(ARGV[14])
  seen = link_check(link, ARGV[12], ARGV[13], adv, link_field)
  if not seen then return {'moved'} end
end
local rec = ARGV[10] ~= '' and cjson.decode(ARGV[10]) or nil
-- The link's writes, once the run it names is known: the advance, the record (with the
-- indexes it joins), and the field naming the run unless it names one already.
local function write_link(id)
  local set, gone = {}, {}
  if adv then gone = link_split(adv, seen.present, set) end
  if rec then
    for k, v in pairs(rec.fields) do set[k] = v end
  end
  if link_field ~= '' then
    if rec or (seen and not seen.field) then
      set[link_field] = id
    elseif not seen then
      redis.call('HSETNX', link, link_field, id)
    end
  end
  if rec then
    link_write(link, set, gone, rec.ttl_s)
    for i = 15, #KEYS do
      redis.call('ZADD', KEYS[i], rec.score, rec.member)
      if tonumber(rec.trim_to) > 0 then
        redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', rec.trim_to)
      end
      redis.call('EXPIRE', KEYS[i], rec.ttl_s)
    end
  elseif adv then
    link_write(link, set, gone, ARGV[15])
  end
end
-- The session: created if missing (sessionId, createdAt, seq 0, its first fields) and
-- touched.
local s = hash_open(session)
local created = 0
if not s.exists then
  created = 1
  hash_set(s, 'sessionId', ARGV[3])
  hash_set(s, 'createdAt', now)
  hash_set(s, 'seq', '0')
  if ARGV[4] ~= '' then hash_update(s, cjson.decode(ARGV[4])) end
  redis.call('HSET', KEYS[2], ARGV[3], session_key)
end
touch_in(s, KEYS[3], KEYS[4], KEYS[5], session_key, now)
local sid = s.f.sessionId or false  -- a session made elsewhere may have none yet
-- A start whose advance applied needs no idempotency key: its compare-and-set lets one
-- copy of the step through, so the key is not written.
if ARGV[8] ~= '' and not adv and not redis.call('SET', KEYS[10], run_id, 'NX', 'EX', ARGV[8]) then
  local existing = redis.call('GET', KEYS[10]) or run_id
  write_link(existing)
  hash_flush(s)
  return {created, sid, 'duplicate', existing}
end
local run = hash_new(run_key, cjson.decode(ARGV[7]))
write_link(run_id)
if redis.call('SET', lane, run_id, 'NX') then
  redis.call('ZADD', leases, lease_at_ms, session_key)
  if ARGV[11] ~= '' then
    local c = cjson.decode(ARGV[11])
    local claim = claim_run(
      {run = run_key, lane = lane, leases = leases, session = session,
       transcript = KEYS[12], events = KEYS[13], notices = KEYS[14]},
      {run_id = run_id, session_key = session_key, now = now, lease_at_ms = lease_at_ms,
       expect = 'queued', max_attempts = c.max_attempts, timeout_ms = c.timeout_ms,
       history = c.history, events_cap = c.events_cap, after_sid = c.after_sid or '',
       after_seq = c.after_seq or '0'},
      {run = run, session = s})
    hash_flush(run)
    hash_flush(s)
    return {created, sid, 'lane', '', claim}
  end
  hash_flush(run)
  hash_flush(s)
  return {created, sid, 'lane', ''}
end
redis.call('RPUSH', lane_queue, run_id)
hash_flush(run)
hash_flush(s)
return {created, sid, 'queued', ''}
