-- Claim a queued run that holds its lane (includes/claim_run.lua says what and answers).
-- KEYS: run lane leases session transcript events notices
-- ARGV: run_id session_key now lease_at_ms expect max_attempts timeout_ms history events_cap after_sid after_seq
-- @include claim_run
return claim_run(
  {run = KEYS[1], lane = KEYS[2], leases = KEYS[3], session = KEYS[4],
   transcript = KEYS[5], events = KEYS[6], notices = KEYS[7]},
  {run_id = ARGV[1], session_key = ARGV[2], now = ARGV[3], lease_at_ms = ARGV[4],
   expect = ARGV[5], max_attempts = ARGV[6], timeout_ms = ARGV[7], history = ARGV[8],
   events_cap = ARGV[9], after_sid = ARGV[10], after_seq = ARGV[11]})
