-- Release, common case first (prepended to common.lua, prelude.lua and
-- release.lua): the lock is ours and nobody waits, so compare and delete
-- is all there is to do (GET, ZCARD of the queue, DEL), before the shared
-- helpers are created (see grant_fast.lua). Anything else (not ours, a
-- queue, an error) falls through to the full script, which reads again.
-- ZCARD, not TYPE: 0 only when no queue exists (a zset is never empty); a
-- queue key of another type, or a user without `+zcard`, errs and so takes
-- the full script, which names a wrong type. TYPE's status reply costs
-- Redis a Lua table: 0.85 µs against 0.45 µs per call (a loop of 100).
do
  if redis.pcall('GET', KEYS[1]) == ARGV[3] then
    if redis.pcall('ZCARD', KEYS[1] .. ':queue') == 0
      and redis.pcall('DEL', KEYS[1]) == 1 then
      return 1
    end
  end
end
