-- Compare-and-delete (DESIGN.md §2.2).
--
-- KEYS[1] lock key; ARGV[1] the exact lock value this holder was granted.
-- Returns 1 when the lock was ours and is now deleted, 0 when it is absent
-- (expired) and -1 when someone else holds it. Never touches another holder.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if v then return -1 end
return 0
