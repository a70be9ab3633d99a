-- Release, common case first (prepended to common.lua, prelude.lua and
-- release.lua): the lock is ours and nobody waits, so compare and delete
-- is all there is to do (GET, TYPE of the queue, DEL), before the shared
-- helpers are created (see grant_fast.lua). Anything else (not ours, a
-- queue, an error) falls through to the full script, which reads again.
do
  if redis.pcall('GET', KEYS[1]) == ARGV[3] then
    local queue = redis.pcall('TYPE', KEYS[1] .. ':queue')
    if type(queue) == 'table' and queue['ok'] == 'none'
      and redis.pcall('DEL', KEYS[1]) == 1 then
      return 1
    end
  end
end
