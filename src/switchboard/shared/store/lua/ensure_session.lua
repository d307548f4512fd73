-- Create a session entry if missing (with its sessionId and sessionId index entry), set
-- the fields always set, and touch it. Answers {created (1|0), sessionId}.
-- KEYS: session sid_index idx_all idx_agent idx_kind
-- ARGV: session_key now session_id on_create always
-- @include create_session
-- @include touch
local created = create_session(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
set_fields(KEYS[1], ARGV[5])
touch(KEYS[1], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2])
return {created, redis.call('HGET', KEYS[1], 'sessionId')}
