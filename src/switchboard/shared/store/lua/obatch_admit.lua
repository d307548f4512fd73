-- Admit a batch's next lines up to its cap: answers {first line, how many} (0 when the
-- batch is not in progress, or is full); the admitted lines join `inflight`, scored by
-- when they were admitted.
-- KEYS: batch inflight
-- ARGV: now_ms
-- @include obatch_admit_next
return admit_next(KEYS[1], KEYS[2], ARGV[1])
