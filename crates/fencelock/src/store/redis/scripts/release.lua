-- Release: compare-and-delete (docs/design.md §2.2), then pass the lock on to the
-- head waiter. After common.lua and prelude.lua (KEYS and ARGV[1] are
-- documented there).
local wake_prefix = LOCK .. ':wake:'  -- wake channel = wake_prefix .. CLIENT
-- ARGV[1] goes on after the mint (see prelude.lua) with how to pass the
-- lock on: a space, "PUBLISH" or "SPUBLISH" (Cluster), a space and the µs
-- after which a waiting notify head is handed the lock
-- ("ct86400000 PUBLISH 10000").
local publish, starving_us = string.match(ARGV[1], ' (%u+) (%d+)$')
starving_us = tonumber(starving_us)
local value = ARGV[2]          -- the exact lock value granted
--
-- Returns 1 when released, 0 when absent (expired), -1 when anything else is
-- there (another holder, or a value of another type). Never touches another
-- holder's lock.

local held = redis.pcall('GET', LOCK)
if type(held) == 'table' then return -1 end
if held ~= value then
  if held then return -1 end
  return 0
end
local queue_live = queue_exists(false)
call('DEL', LOCK)
if queue_live then pass_on(wake_prefix, publish, starving_us) end
return 1
