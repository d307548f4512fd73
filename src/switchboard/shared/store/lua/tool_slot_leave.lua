-- Take a process out of a tool server's line of waiting processes: its last waiting call
-- stopped waiting without a slot (a timeout, a cancelled run). Answers 1 when it was there.
-- KEYS: queue seen
-- ARGV: proc
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
