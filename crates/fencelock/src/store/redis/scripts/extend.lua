-- Compare-and-pexpire (docs/design.md §2.2). After common.lua.
local lock = KEYS[1]
local value = ARGV[1]          -- the exact lock value granted
local ttl_ms = ARGV[2]         -- the new ttl
--
-- Returns 1 when extended, 0 when absent, -1 when anything else is there
-- (another holder, or a value of another type). Never re-creates an expired
-- lock: PEXPIRE only runs on a key that exists and still holds our value.
-- The fence is not touched.

local held = redis.pcall('GET', lock)
if type(held) == 'table' then return -1 end
if held == value then
  call('PEXPIRE', lock, ttl_ms)
  return 1
end
if held then return -1 end
return 0
