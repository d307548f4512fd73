-- Leave a notification (transcript-form JSON) for a session's next turn, starting no run:
-- appended to the session's notices and counted on the session (`noticesQueued`: the next
-- run's first claim moves them into the transcript, includes/claim_run.lua). Answers 1, or
-- 0 (nothing written) when the session does not exist.
-- KEYS: session notices
-- ARGV: message
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'noticesQueued', 1)
return 1
