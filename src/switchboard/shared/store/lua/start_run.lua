-- Start a run in one step: create the session entry if missing and touch it (as
-- ensure_session); map the idempotency key to the run unless it already names one (then
-- record nothing); record the run and take the lane or queue behind the holder (as
-- submit_run).
-- A record written with the run, at the `link` hash (the store does not know what it
-- is; a caller's own record that must exist exactly when the run does):
--   link_field: name the run (or the one the idempotency key names) in this field of
--     `link` unless the field is set (first writer wins); '' = no link.
--   record: JSON {fields, ttl_s, member, score, trim_to}: first write these fields on
--     `link`, keep it ttl_s, and add member at score to each of *record_indexes (sorted
--     sets kept ttl_s, members at or below trim_to dropped); '' = none.
--   advance_*: first a compare-and-set on `link` (includes/link_advance.lua); when the
--     hash has moved on, nothing is written and the answer is {'moved'};
--     advance_status '' = none.
-- claim: JSON {history, max_attempts, timeout_ms, events_cap, after_sid, after_seq}: a
-- run that took the lane is claimed in the same step (as claim_run, its history after
-- the caller's window when that still applies) for the caller to execute at once, the
-- claim's answer the fifth element; '' = no claim.
-- Answers {created, sessionId, 'lane' | 'queued' | 'duplicate', the run id the
-- idempotency key names[, claim]}.
-- Without an idempotency key or a link, `idempotency` and `link` are the run's own hash
-- (a key the script names anyway: never written through those names).
-- KEYS: session sid_index idx_all idx_agent idx_kind run lane lane_queue leases idempotency link active transcript metrics events *record_indexes
-- ARGV: session_key now session_id on_create run_id lease_at_ms run_fields idem_ttl_s link_field record claim advance_status advance_turn advance_fields advance_ttl_s
-- @include set_fields
-- @include link_advance
-- @include create_session
-- @include touch
-- @include claim_run
local session, run, link = KEYS[1], KEYS[6], KEYS[11]
local lane, lane_queue, leases = KEYS[7], KEYS[8], KEYS[9]
local session_key, now, run_id, lease_at_ms = ARGV[1], ARGV[2], ARGV[5], ARGV[6]
if ARGV[12] ~= '' and not link_advance(link, ARGV[12], ARGV[13], ARGV[14], ARGV[15]) then
  return {'moved'}
end
local function name_in_link(id)
  if ARGV[9] ~= '' then redis.call('HSETNX', link, ARGV[9], id) end
end
if ARGV[10] ~= '' then
  local rec = cjson.decode(ARGV[10])
  set_table(link, rec.fields)
  redis.call('EXPIRE', link, rec.ttl_s)
  for i = 16, #KEYS do
    redis.call('ZADD', KEYS[i], rec.score, rec.member)
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', rec.trim_to)
    redis.call('EXPIRE', KEYS[i], rec.ttl_s)
  end
end
local created = create_session(session, KEYS[2], session_key, now, ARGV[3], ARGV[4])
touch(session, KEYS[3], KEYS[4], KEYS[5], session_key, now)
local sid = redis.call('HGET', session, 'sessionId')
if ARGV[8] ~= '' and not redis.call('SET', KEYS[10], run_id, 'NX', 'EX', ARGV[8]) then
  local existing = redis.call('GET', KEYS[10]) or run_id
  name_in_link(existing)
  return {created, sid, 'duplicate', existing}
end
set_fields(run, ARGV[7])
name_in_link(run_id)
if redis.call('SET', lane, run_id, 'NX') then
  redis.call('ZADD', leases, lease_at_ms, session_key)
  if ARGV[11] ~= '' then
    local c = cjson.decode(ARGV[11])
    local claim = claim_run(
      {run = run, lane = lane, leases = leases, active = KEYS[12], session = session,
       transcript = KEYS[13], idx_all = KEYS[3], idx_agent = KEYS[4], idx_kind = KEYS[5],
       metrics = KEYS[14], events = KEYS[15]},
      {run_id = run_id, session_key = session_key, now = now, lease_at_ms = lease_at_ms,
       expect = 'queued', max_attempts = c.max_attempts, timeout_ms = c.timeout_ms,
       history = c.history, events_cap = c.events_cap, after_sid = c.after_sid or '',
       after_seq = c.after_seq or '0'})
    return {created, sid, 'lane', '', claim}
  end
  return {created, sid, 'lane', ''}
end
redis.call('RPUSH', lane_queue, run_id)
return {created, sid, 'queued', ''}
