-- Compare-and-pexpire (DESIGN.md §2.2).
--
-- KEYS[1] lock key; ARGV[1] the exact lock value; ARGV[2] new ttl in ms.
-- Returns 1 when extended, 0 when absent, -1 when held by someone else.
-- Never re-creates an expired lock: PEXPIRE only runs on a key that exists
-- and still holds our value. The fence is not touched.
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if v then return -1 end
return 0
