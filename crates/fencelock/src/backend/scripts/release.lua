-- Release: compare-and-delete (DESIGN.md §2.2), then pass the lock on to the
-- head waiter. Prepended with prelude.lua (KEYS and ARGV 1-3 are documented
-- there).
local wake_prefix = ARGV[4]    -- wake channel = wake_prefix .. CLIENT
local publish = ARGV[5]        -- "PUBLISH", or "SPUBLISH" on Cluster
local starving_us = tonumber(ARGV[6])  -- a notify head that waited this long is handed the lock
local value = ARGV[7]          -- the exact lock value granted
--
-- Returns 1 when released, 0 when absent (expired), -1 when another holds
-- it. Never touches another holder's lock.

local held = redis.call('GET', LOCK)
if held ~= value then
  if held then return -1 end
  return 0
end
redis.call('DEL', LOCK)
pass_on(wake_prefix, publish, starving_us)
return 1
